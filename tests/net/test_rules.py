"""E2B's allowOut/denyOut lists checked into a sandbox's egress rules."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from agentenv.errors import InvalidInput
from agentenv.net.rules import (
    DEFAULT_DNS_SERVERS,
    MAX_ENTRIES,
    EgressRules,
    egress_of,
    parse_egress,
)
from agentenv.net.transforms import normalize_rules


def test_domains_over_denying_all_traffic() -> None:
    rules = parse_egress(["Site.test.", "*.pkgs.test", "192.0.2.10"], ["0.0.0.0/0"])
    assert rules.domains == ("site.test", "*.pkgs.test")
    assert rules.allow == (IPv4Network("192.0.2.10/32"),)
    assert rules.allows_host("site.test") and rules.allows_host("files.pkgs.test")
    assert not rules.allows_host("pkgs.test") and not rules.allows_host("evil-site.test")
    assert not rules.allows_host("site.test.evil.test")
    # No internet is all traffic denied already.
    assert parse_egress(["*"], [], internet=False).allows_host("anything.test")


def test_addresses_and_blocks() -> None:
    rules = parse_egress(["192.0.2.10", "198.51.100.0/24"], ["0.0.0.0/0"])
    assert rules.allow == (IPv4Network("192.0.2.10/32"), IPv4Network("198.51.100.0/24"))
    assert rules.denied == (IPv4Network("0.0.0.0/0"),)
    assert not rules.unrestricted and EgressRules().unrestricted
    # No internet is all traffic denied, as E2B defines it.
    assert egress_of({}, internet=False).denied == (IPv4Network("0.0.0.0/0"),)
    assert egress_of({"denyOut": ["198.51.100.8"]}, True).deny == (IPv4Network("198.51.100.8/32"),)


@pytest.mark.parametrize(
    ("allow", "deny", "message"),
    [
        ([], ["site.test"], "invalid denied CIDR site.test"),
        (["not an address"], [], "invalid allowed address not an address"),
        (["300.1.1.1"], [], "invalid allowed address"),
        (["*.site.test"], ["198.51.100.8"], "must include 'ALL_TRAFFIC' in deny out"),
        (["exa mple.com"], ["0.0.0.0/0"], "invalid allowed address exa mple.com"),
        (["2001:db8::/32"], [], "IPv4 only"),
        (["192.0.2.10"] * (MAX_ENTRIES + 1), [], f"at most {MAX_ENTRIES} entries"),
    ],
)
def test_bad_entries_are_named(allow: list[str], deny: list[str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_egress(allow, deny)


def test_dns_servers_default_to_e2bs_and_may_be_none() -> None:
    assert parse_egress([], []).dns_servers == DEFAULT_DNS_SERVERS
    assert parse_egress([], [], dns_servers=[]).dns_servers == ()
    given = egress_of({"dnsServers": ["192.0.2.53", "198.51.100.53"]}, True)
    assert given.dns_servers == (IPv4Address("192.0.2.53"), IPv4Address("198.51.100.53"))
    with pytest.raises(InvalidInput, match=r"network.dnsServers: .*IPv4 address"):
        parse_egress([], [], dns_servers=["dns.example.test"])


def test_transforms_exact_names_beat_the_longest_wildcard() -> None:
    rules = normalize_rules(
        {
            "API.Example.test": [{"transform": {"headers": {"X-Key": "exact"}}}],
            "*.example.test": [{"transform": {"headers": {"X-Key": "short"}}}],
            "*.deep.example.test": [
                {"transform": {"headers": {"X-Key": "long"}}},
                {"transform": {"headers": {"X-Other": "2"}}},
                {},
            ],
        }
    )
    transforms = egress_of({"rules": rules}, True).transforms
    assert transforms.headers_for("api.example.test") == (("X-Key", "exact"),)
    assert transforms.headers_for("a.b.deep.example.test") == (("X-Key", "long"), ("X-Other", "2"))
    assert transforms.headers_for("www.example.test") == (("X-Key", "short"),)
    # A wildcard never matches its apex, nor a name that merely ends alike.
    assert transforms.headers_for("example.test") is None
    assert transforms.headers_for("badexample.test") is None
    assert not EgressRules().transforms


@pytest.mark.parametrize("key", ["*", "*.", "exa mple.test", "192.0.2.1", "**.example.test"])
def test_bad_rule_keys_are_named(key: str) -> None:
    with pytest.raises(InvalidInput, match=r"network.rules: .*neither a DNS name"):
        normalize_rules({key: []})
