"""E2B's allowOut/denyOut lists checked into a sandbox's egress rules."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest

from agentenv.errors import InvalidInput
from agentenv.net.rules import MAX_ENTRIES, EgressRules, egress_of, parse_egress


def test_domains_over_denying_all_traffic() -> None:
    rules = parse_egress(["Example.com.", "*.pypi.org", "1.1.1.1"], ["0.0.0.0/0"])
    assert rules.domains == ("example.com", "*.pypi.org")
    assert rules.allow == (IPv4Network("1.1.1.1/32"),)
    assert rules.allows_host("example.com") and rules.allows_host("files.pypi.org")
    assert not rules.allows_host("pypi.org") and not rules.allows_host("evil-example.com")
    assert not rules.allows_host("example.com.evil.test")
    # No internet is all traffic denied already.
    assert parse_egress(["*"], [], internet=False).allows_host("anything.test")


def test_addresses_and_blocks() -> None:
    rules = parse_egress(["1.1.1.1", "8.8.8.0/24"], ["0.0.0.0/0"])
    assert rules.allow == (IPv4Network("1.1.1.1/32"), IPv4Network("8.8.8.0/24"))
    assert rules.denied == (IPv4Network("0.0.0.0/0"),)
    assert not rules.unrestricted and EgressRules().unrestricted
    # No internet is all traffic denied, as E2B defines it.
    assert egress_of({}, internet=False).denied == (IPv4Network("0.0.0.0/0"),)
    assert egress_of({"denyOut": ["8.8.8.8"]}, True).deny == (IPv4Network("8.8.8.8/32"),)


@pytest.mark.parametrize(
    ("allow", "deny", "message"),
    [
        ([], ["example.com"], "invalid denied CIDR example.com"),
        (["not an address"], [], "invalid allowed address not an address"),
        (["300.1.1.1"], [], "invalid allowed address"),
        (["*.example.com"], ["8.8.8.8"], "must include 'ALL_TRAFFIC' in deny out"),
        (["exa mple.com"], ["0.0.0.0/0"], "invalid allowed address exa mple.com"),
        (["2001:db8::/32"], [], "IPv4 only"),
        (["1.1.1.1"] * (MAX_ENTRIES + 1), [], f"at most {MAX_ENTRIES} entries"),
    ],
)
def test_bad_entries_are_named(allow: list[str], deny: list[str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_egress(allow, deny)
