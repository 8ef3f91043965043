"""Which host resolver guests' DNS queries are forwarded to by default."""

from __future__ import annotations

from ipaddress import IPv4Address
from pathlib import Path

from agentenv.net.dns import host_dns_server, nameservers


def test_nameservers_keeps_reachable_ipv4_servers_only() -> None:
    text = (
        "# generated\nsearch example.internal\nnameserver 127.0.0.53\nnameserver ::1\n"
        "nameserver fd00::53\nnameserver 10.255.255.53\nnameserver bogus\nnameserver\n"
        "options edns0\nnameserver 198.51.100.53 # trailing\n"
    )
    assert nameservers(text) == [IPv4Address("10.255.255.53"), IPv4Address("198.51.100.53")]


def test_host_dns_server_prefers_systemd_resolveds_upstreams(tmp_path: Path) -> None:
    upstreams, stub = tmp_path / "upstreams.conf", tmp_path / "resolv.conf"
    stub.write_text("nameserver 127.0.0.53\n")
    # No systemd-resolved: the stub file alone names nothing a guest can reach.
    assert host_dns_server([upstreams, stub]) is None
    upstreams.write_text("nameserver 192.168.1.1\nnameserver 192.168.1.2\n")
    assert host_dns_server([upstreams, stub]) == IPv4Address("192.168.1.1")
    upstreams.write_text("")
    stub.write_text("nameserver 10.0.0.2\n")
    assert host_dns_server([upstreams, stub]) == IPv4Address("10.0.0.2")
