"""The egress CA: the same for every node sharing a secret, and minting leaves that verify."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from agentenv.net.authority import EgressAuthority


def _public_key(authority: EgressAuthority) -> bytes:
    return authority.certificate.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_nodes_sharing_a_secret_share_the_ca() -> None:
    one, other = EgressAuthority(b"cluster key"), EgressAuthority(b"cluster key")
    assert _public_key(one) == _public_key(other)
    assert one.certificate.subject == other.certificate.subject
    assert _public_key(EgressAuthority(b"another key")) != _public_key(one)


async def test_a_leaf_of_one_node_verifies_against_the_ca_another_derived(tmp_path: Path) -> None:
    minting, trusted = EgressAuthority(b"cluster key"), EgressAuthority(b"cluster key")
    ca = tmp_path / "ca.pem"
    ca.write_text(trusted.ca_pem)
    server = await asyncio.start_server(
        lambda r, w: None, "127.0.0.1", 0, ssl=minting.server_context("api.site.test")
    )
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ca))
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname="api.site.test"
        )
        writer.close()
        # The same context is kept for a name; another name gets its own certificate.
        assert minting.server_context("api.site.test") is minting.server_context("api.site.test")
        try:
            await asyncio.open_connection(
                "127.0.0.1", port, ssl=client, server_hostname="other.site.test"
            )
            raise AssertionError("a certificate for api.site.test passed for another name")
        except ssl.SSLCertVerificationError:
            pass
    finally:
        server.close()
        await server.wait_closed()
