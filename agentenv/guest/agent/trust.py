"""The certificate authority of the node's egress proxy, trusted by the guest: the proxy
answers HTTPS requests that header rules apply to (`net/authority.py` on the host).

Added to the system's bundle (what OpenSSL, curl and most runtimes read), kept as an anchor
where Debian's `update-ca-certificates` finds it again, and named in the variables Python's
requests, Node and curl read, which otherwise bring bundles of their own.
"""

from __future__ import annotations

import os

from .rootfs import RootFS

# Debian, Ubuntu and Alpine; Fedora and RHEL.
BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
ANCHOR = "/usr/local/share/ca-certificates/aenv-egress.crt"


def trust(rootfs: RootFS, pem: str) -> dict[str, str]:
    """Make the guest trust `pem`; the environment variables that point tools at it."""
    pem = pem.strip() + "\n"
    _write(rootfs.host(ANCHOR), pem)
    bundles = [b for b in BUNDLES if os.path.isfile(rootfs.host(b))] or [BUNDLES[0]]
    for bundle in bundles:
        path = rootfs.host(bundle)
        try:
            with open(path) as fh:
                held = fh.read()
        except FileNotFoundError:
            held = ""
        if pem not in held:
            _write(path, held + ("\n" if held and not held.endswith("\n") else "") + pem)
    return {
        "SSL_CERT_FILE": bundles[0],
        "REQUESTS_CA_BUNDLE": bundles[0],
        "CURL_CA_BUNDLE": bundles[0],
        "NODE_EXTRA_CA_CERTS": ANCHOR,
    }


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.aenv-new"
    with open(temporary, "w") as fh:
        fh.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
