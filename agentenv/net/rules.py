"""A sandbox's own egress rules, as E2B's `network` option gives them: `allowOut` and
`denyOut` address lists, allowed entries winning over denied ones.

They narrow what the node's policy (`net/policy.py`) lets guests reach and never widen it:
an `allowOut` entry does not open a private range, the host or another sandbox.
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

    @property
    def unrestricted(self) -> bool:
        return self.internet and not self.allow and not self.deny

    @property
    def denied(self) -> tuple[IPv4Network, ...]:
        """The denied ranges, all traffic when internet access is off (E2B's equivalence)."""
        return self.deny if self.internet else (IPv4Network(ALL_TRAFFIC),)


def parse_egress(allow_out: list[str], deny_out: list[str], internet: bool = True) -> EgressRules:
    """Rules from E2B's lists; InvalidInput names the first bad entry."""
    return EgressRules(internet, _networks("allowOut", allow_out), _networks("denyOut", deny_out))


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
            if field == "allowOut" and _looks_like_domain(entry):
                raise InvalidInput(
                    f"network.allowOut: {entry!r}: domain rules are not supported yet;"
                    " give IP addresses or CIDR blocks"
                ) from None
            raise InvalidInput(f"invalid {_NOUN[field]} {entry}") from None
        if not isinstance(network, IPv4Network):
            raise InvalidInput(f"network.{field}: {entry!r}: sandboxes have IPv4 only")
        networks.append(network)
    return tuple(networks)


# E2B's error texts name the entries so.
_NOUN = {"allowOut": "allowed address", "denyOut": "denied CIDR"}


def _looks_like_domain(entry: str) -> bool:
    labels = entry.removeprefix("*.").split(".")
    # A top-level label is never all digits: `300.1.1.1` is a bad address, not a name.
    return not labels[-1].isdigit() and all(
        label and label.replace("-", "").isalnum() and label.isascii() for label in labels
    )
