"""E2B's allowOut/denyOut lists checked into a sandbox's egress rules."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest

from agentenv.errors import InvalidInput
from agentenv.net.rules import MAX_ENTRIES, EgressRules, egress_of, parse_egress


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
