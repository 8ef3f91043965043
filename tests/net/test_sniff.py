"""Host names read from a connection's first bytes: real ClientHellos from Python's ssl."""

from __future__ import annotations

import ssl

from agentenv.net.sniff import http_host, tls_server_name


def client_hello(server_name: str | None) -> bytes:
    """The first record an ssl client sends for `server_name`."""
    context = ssl.create_default_context()
    context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def test_tls_server_name() -> None:
    assert tls_server_name(client_hello("API.Site.test")) == "api.site.test"
    assert tls_server_name(client_hello(None)) is None
    hello = client_hello("site.test")
    # Cut short, not a handshake, or noise: no name, and no exception.
    for broken in (hello[:40], b"\x17" + hello[1:], b"GET / HTTP/1.1\r\n", b"", b"\x16\x03"):
        assert tls_server_name(broken) is None


def test_http_host() -> None:
    assert http_host(b"GET / HTTP/1.1\r\nHost: Site.TEST:8080\r\nX: y\r\n\r\n") == "site.test"
    assert http_host(b"GET / HTTP/1.1\r\nhost:site.test.\r\n\r\n") == "site.test"
    assert http_host(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n") is None
    assert http_host(b"GET / HTTP/1.1\r\nX: y\r\n\r\nHost: body.example\r\n") is None
    assert http_host(b"\x16\x03\x01") is None
