"""A sandbox's own egress rules, as E2B's `network` option gives them: `allowOut` (addresses,
CIDR blocks and domains) and `denyOut` (addresses and CIDR blocks), allowed entries winning
over denied ones.

They narrow what the node's policy (`net/policy.py`) lets guests reach and never widen it:
an `allowOut` entry does not open a private range, the host or another sandbox. Domains are
matched on HTTP's Host header and TLS's server name by the node's egress proxy
(`net/egressproxy.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, ip_network
from typing import Any

from ..errors import InvalidInput
from .dns import is_dns_name
from .socks import SocksUpstream
from .transforms import HeaderRules, header_rules, normalize_rules

ALL_TRAFFIC = "0.0.0.0/0"
# The keys of the `network` option that hold egress settings (an update replaces them all).
EGRESS_FIELDS = ("allowOut", "denyOut", "dnsServers", "egressProxy", "rules")
# Reachable by a sandbox whose `allowOut` holds a domain, unless `dnsServers` says otherwise.
DEFAULT_DNS_SERVERS = (IPv4Address("8.8.8.8"),)
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
    # Opened (all traffic, within the node's policy) when `domains` is not empty.
    dns_servers: tuple[IPv4Address, ...] = DEFAULT_DNS_SERVERS
    # Headers set on HTTPS requests to matching hosts (`net/transforms.py`).
    transforms: HeaderRules = field(default_factory=HeaderRules)
    # The SOCKS5 server all allowed TCP goes through (`net/tunnels.py`); None: straight.
    upstream: SocksUpstream | None = None

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

    def allows(self, host: str, address: IPv4Address) -> bool:
        """Whether a connection to `host` at `address` is allowed: by its name, or by the
        address (an allowed entry winning over a denied one)."""
        if self.allows_host(host) or any(address in allowed for allowed in self.allow):
            return True
        return not any(address in denied for denied in self.denied)


def parse_egress(
    allow_out: list[str],
    deny_out: list[str],
    internet: bool = True,
    dns_servers: list[str] | None = None,
    rules: dict[str, list[dict[str, Any]]] | None = None,
    egress_proxy: dict[str, Any] | None = None,
) -> EgressRules:
    """Rules from E2B's settings; InvalidInput names the first bad entry."""
    domains = tuple(_domain(e) for e in allow_out if _looks_like_domain(e))
    addresses = [e for e in allow_out if not _looks_like_domain(e)]
    deny = _networks("denyOut", deny_out)
    if domains and internet and IPv4Network(ALL_TRAFFIC) not in deny:
        # E2B's rule and words: a domain allow-list only makes sense over denying all.
        raise InvalidInput(
            "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC'"
            " in deny out to block all other traffic."
        )
    return EgressRules(
        internet,
        _networks("allowOut", addresses),
        deny,
        domains,
        DEFAULT_DNS_SERVERS if dns_servers is None else _addresses("dnsServers", dns_servers),
        header_rules(normalize_rules(rules or {})),
        SocksUpstream.of(egress_proxy) if egress_proxy else None,
    )


def egress_of(network: dict[str, Any], internet: bool) -> EgressRules:
    """The rules stored in a sandbox record's `network` (already checked on the way in)."""
    return parse_egress(
        network.get("allowOut", []),
        network.get("denyOut", []),
        internet,
        network.get("dnsServers"),
        network.get("rules"),
        network.get("egressProxy"),
    )


def _addresses(field: str, entries: list[str]) -> tuple[IPv4Address, ...]:
    try:
        return tuple(IPv4Address(entry.strip()) for entry in entries)
    except ValueError as exc:
        raise InvalidInput(f"network.{field}: {exc}; each entry must be an IPv4 address") from None


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
    return name == "*" or is_dns_name(name.removeprefix("*."))


def _matches(host: str, pattern: str) -> bool:
    if pattern == "*" or host == pattern:
        return True
    return pattern.startswith("*.") and host.endswith(pattern[1:])
