"""Fixtures of the network tests: a prefix and subnet of their own, and the lab around the
host."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest

from agentenv.net.netns import ensure_host_forwarding

from ..netlab import Lab, lab, remove_host_chains, sh, unique


@pytest.fixture(scope="module")
def network() -> Iterator[tuple[str, str]]:
    """A name prefix and subnet of this test's own, with the host chains a server installs."""
    used = sh("ip", "-o", "-4", "addr")
    octet = secrets.choice([n for n in range(190, 250) if f" 10.{n}." not in used])
    prefix, subnet = unique("nl"), f"10.{octet}.0.0/16"
    try:
        asyncio.run(ensure_host_forwarding(subnet, prefix))
        yield prefix, subnet
    finally:
        remove_host_chains(prefix, subnet)


@pytest.fixture(scope="module")
def around(network: tuple[str, str]) -> Iterator[Lab]:
    with lab(network[1]) as made:
        yield made
