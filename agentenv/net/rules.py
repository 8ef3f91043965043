"""A sandbox's own egress rules, as E2B's `network` option gives them: `allowOut` (addresses,
CIDR blocks and domains) and `denyOut` (addresses and CIDR blocks), allowed entries winning
over denied ones.

They narrow what the node's policy (`net/policy.py`) lets guests reach and never widen it:
an `allowOut` entry does not open a private range, the host or another sandbox. Domains are
matched on HTTP's Host header and TLS's server name by the node's egress proxy
(`net/egressproxy.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, ip_network
from typing import Any

from ..errors import InvalidInput

ALL_TRAFFIC = "0.0.0.0/0"
# The keys of the `network` option that hold egress rules (an update replaces them all).
EGRESS_FIELDS = ("allowOut", "denyOut")
# Per list; each entry becomes one rule in the namespace.
MAX_ENTRIES = 256


@dataclass(frozen=True)
class EgressRules:
    """What one sandbox may open, within the node's policy; the default is everything."""

    internet: bool = True
    allow: tuple[IPv4Network, ...] = ()
    deny: tuple[IPv4Network, ...] = ()
    # Host names (`site.test`, `*.site.test`, `*`) allowed over HTTP and TLS.
    domains: tuple[str, ...] = ()

    @property
    def unrestricted(self) -> bool:
        return self.internet and not self.allow and not self.deny and not self.domains

    @property
    def denied(self) -> tuple[IPv4Network, ...]:
        """The denied ranges, all traffic when internet access is off (E2B's equivalence)."""
        return self.deny if self.internet else (IPv4Network(ALL_TRAFFIC),)

    def allows_host(self, host: str) -> bool:
        """Whether `host` (lower-case) matches an allowed domain, as E2B matches them."""
        return any(_matches(host, pattern) for pattern in self.domains)


def parse_egress(allow_out: list[str], deny_out: list[str], internet: bool = True) -> EgressRules:
    """Rules from E2B's lists; InvalidInput names the first bad entry."""
    domains = tuple(_domain(e) for e in allow_out if _looks_like_domain(e))
    addresses = [e for e in allow_out if not _looks_like_domain(e)]
    deny = _networks("denyOut", deny_out)
    if domains and internet and IPv4Network(ALL_TRAFFIC) not in deny:
        # E2B's rule and words: a domain allow-list only makes sense over denying all.
        raise InvalidInput(
            "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC'"
            " in deny out to block all other traffic."
        )
    return EgressRules(internet, _networks("allowOut", addresses), deny, domains)


def egress_of(network: dict[str, Any], internet: bool) -> EgressRules:
    """The rules stored in a sandbox record's `network` (already checked on the way in)."""
    return parse_egress(network.get("allowOut", []), network.get("denyOut", []), internet)


def _networks(field: str, entries: list[str]) -> tuple[IPv4Network, ...]:
    if len(entries) > MAX_ENTRIES:
        raise InvalidInput(f"network.{field}: at most {MAX_ENTRIES} entries, {len(entries)} given")
    networks = []
    for entry in entries:
        try:
            network = ip_network(entry.strip(), strict=False)
        except ValueError:
            raise InvalidInput(f"invalid {_NOUN[field]} {entry}") from None
        if not isinstance(network, IPv4Network):
            raise InvalidInput(f"network.{field}: {entry!r}: sandboxes have IPv4 only")
        networks.append(network)
    return tuple(networks)


# E2B's error texts name the entries so.
_NOUN = {"allowOut": "allowed address", "denyOut": "denied CIDR"}


def _domain(entry: str) -> str:
    return entry.strip().lower().rstrip(".")


def _looks_like_domain(entry: str) -> bool:
    name = _domain(entry)
    if name == "*":
        return True
    labels = name.removeprefix("*.").split(".")
    # A top-level label is never all digits: `300.1.1.1` is a bad address, not a name.
    return (
        not labels[-1].isdigit()
        and all(
            0 < len(label) < 64 and label.replace("-", "").replace("_", "").isalnum()
            for label in labels
        )
        and name.isascii()
    )


def _matches(host: str, pattern: str) -> bool:
    if pattern == "*" or host == pattern:
        return True
    return pattern.startswith("*.") and host.endswith(pattern[1:])
