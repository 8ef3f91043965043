"""The certificate authority guests trust for their HTTPS requests that the egress proxy
opens to apply header rules (`net/transforms.py`), and the leaf certificates it mints.

The CA's key is derived from a secret every node of a cluster shares, so each node holds
the same CA without storing or copying a key: a sandbox paused on one node and resumed on
another, a fork, or a snapshot's sandbox keeps trusting the node that serves it. The key
never enters a guest; guests get the certificate alone (`guest/agent/trust.py`).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "AgentENV egress CA"
# Fixed, so every node derives the same certificate: the CA lives as long as its secret.
_CA_NOT_BEFORE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
_CA_NOT_AFTER = datetime.datetime(2046, 1, 1, tzinfo=datetime.UTC)
# It signs certificates, nothing else.
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False, content_commitment=False, key_encipherment=False,
    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
    encipher_only=False, decipher_only=False,
)  # fmt: skip
# Leaves are minted for a day and used for half of it.
LEAF_LIFETIME = datetime.timedelta(days=1)
# Host names whose TLS contexts are kept (each holds a certificate and a key).
MAX_CACHED_LEAVES = 1024


class EgressAuthority:
    """A CA derived from `secret`, minting a server certificate per host name on demand."""

    def __init__(self, secret: bytes) -> None:
        seed = hmac.new(secret, b"aenv egress certificate authority", hashlib.sha256).digest()
        order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's n
        self._key = ec.derive_private_key(int.from_bytes(seed) % (order - 1) + 1, ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
        self._name = name
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(int.from_bytes(seed[:8]) >> 1)
            .not_valid_before(_CA_NOT_BEFORE)
            .not_valid_after(_CA_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_KEY_USAGE, critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        # One key for every leaf: minting then costs a signature, not a key generation.
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._leaves: OrderedDict[str, tuple[float, ssl.SSLContext]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ca_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for `host`, minted when needed."""
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[0] > time.time():
                self._leaves.move_to_end(host)
                return cached[1]
        context = self._mint(host)
        with self._lock:
            self._leaves[host] = (time.time() + LEAF_LIFETIME.total_seconds() / 2, context)
            while len(self._leaves) > MAX_CACHED_LEAVES:
                self._leaves.popitem(last=False)
        return context

    def _mint(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self._name)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + LEAF_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # Guests speak HTTP/1.1 to the proxy, whatever they would speak to the server.
        context.set_alpn_protocols(["http/1.1"])
        pem = leaf.public_bytes(serialization.Encoding.PEM) + self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # ssl reads certificates from files only; the file lives as long as this call.
        with tempfile.NamedTemporaryFile(suffix=".pem") as file:
            Path(file.name).write_bytes(pem)
            context.load_cert_chain(file.name)
        return context
