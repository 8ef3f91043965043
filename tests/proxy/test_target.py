from __future__ import annotations

import pytest

from agentenv.proxy.target import BadTarget, Target, find_target


def test_header_wins_and_defaults_to_envd_port() -> None:
    headers = {b"e2b-sandbox-id": b"iabc", b"host": b"8080-other.example.com"}
    assert find_target(headers, "/files?path=x", "example.com") == Target(
        "iabc", 49983, "/files?path=x"
    )
    headers[b"e2b-sandbox-port"] = b"8080"
    assert find_target(headers, "/", "example.com").port == 8080


def test_host_routing_only_with_a_domain() -> None:
    headers = {b"host": b"3000-iabc.sbx.example.com:8000"}
    assert find_target(headers, "/a?b=1", "sbx.example.com") == Target("iabc", 3000, "/a?b=1")
    assert find_target(headers, "/a", "") is None
    assert find_target({b"host": b"x.y.sbx.example.com"}, "/", "sbx.example.com") is None


def test_path_routing_strips_the_prefix() -> None:
    by_path = find_target({}, "/proxy/iabc/8080/x/y?q=1", "")
    assert by_path == Target("iabc", 8080, "/x/y?q=1", by_path=True)
    assert find_target({}, "/proxy/iabc/8080", "") == Target("iabc", 8080, "/", by_path=True)
    assert find_target({}, "/v2/sandboxes", "") is None


@pytest.mark.parametrize("port", [b"0", b"70000", b"http"])
def test_bad_ports_are_refused(port: bytes) -> None:
    with pytest.raises(BadTarget):
        find_target({b"e2b-sandbox-id": b"iabc", b"e2b-sandbox-port": port}, "/", "")


@pytest.mark.parametrize(
    "headers",
    [{b"e2b-sandbox-id": b"\xff"}, {b"e2b-sandbox-id": b"iabc", b"e2b-sandbox-port": b"\xc3\xa9"}],
)
def test_non_ascii_routing_headers_are_bad_targets(headers: dict[bytes, bytes]) -> None:
    with pytest.raises(BadTarget, match="ASCII"):
        find_target(headers, "/", "")


@pytest.mark.parametrize("port", ["\xb2", "\xb9000"])  # '²', '¹000': digits to str.isdigit
def test_non_ascii_digits_in_a_host_are_bad_targets(port: str) -> None:
    host = f"{port}-iabc.sbx.example.com".encode("latin-1")
    with pytest.raises(BadTarget, match="not a TCP port"):
        find_target({b"host": host}, "/", "sbx.example.com")


def test_only_the_path_form_shares_the_servers_origin() -> None:
    by_path = find_target({}, "/proxy/iabc/8080/", "")
    assert by_path is not None and by_path.shares_origin({})
    # Relayed by a control plane: the client's own form decides.
    assert by_path.shares_origin({b"aenv-addressed-by": b"path"})
    assert not by_path.shares_origin({b"aenv-addressed-by": b"other"})
    by_header = find_target({b"e2b-sandbox-id": b"iabc"}, "/proxy/iabc/8080/", "")
    assert by_header is not None and not by_header.shares_origin({})
