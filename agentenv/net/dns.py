"""DNS on the host: its resolver (where guests' queries to their gateway go by default),
and what counts as a host name."""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, ip_address
from pathlib import Path

# systemd-resolved's list names its upstream servers; /etc/resolv.conf then names only its
# stub on 127.0.0.53, which a namespace cannot reach (Docker reads the same two files).
RESOLV_CONF_FILES = (Path("/run/systemd/resolve/resolv.conf"), Path("/etc/resolv.conf"))


def nameservers(resolv_conf: str) -> list[IPv4Address]:
    """The IPv4 `nameserver` entries of a resolv.conf, except loopback ones."""
    found = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        try:
            address = ip_address(fields[1])
        except ValueError:
            continue
        if isinstance(address, IPv4Address) and not address.is_loopback:
            found.append(address)
    return found


def host_dns_server(files: Iterable[Path] = RESOLV_CONF_FILES) -> IPv4Address | None:
    """The first resolver the host's configuration names that a guest's queries can go to."""
    for path in files:
        try:
            servers = nameservers(path.read_text())
        except OSError:
            continue
        if servers:
            return servers[0]
    return None


def is_dns_name(name: str) -> bool:
    """Whether `name` (lower case, no trailing dot) is a host name, not an address."""
    labels = name.split(".")
    # A top-level label is never all digits: `300.1.1.1` is a bad address, not a name.
    return (
        name.isascii()
        and len(name) <= 253
        and not labels[-1].isdigit()
        and all(
            0 < len(label) < 64 and label.replace("-", "").replace("_", "").isalnum()
            for label in labels
        )
    )
