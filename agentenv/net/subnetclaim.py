"""A node's claim on its sandbox subnet: one node per subnet in a network namespace.

Two nodes on one host with the same `net.host_subnet` would give their sandboxes the same
host-side addresses, and the host would route one node's calls to the other's guests,
access tokens included. The claim is a lock file the node holds while it runs (the kernel
drops it when the process dies, however it dies).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

CLAIMS_DIR = Path("/run/lock/aenv-subnets")


class SubnetTaken(RuntimeError):
    """Another node in this network namespace holds the subnet."""


@contextlib.contextmanager
def claimed_subnet(subnet: str, claims_dir: Path = CLAIMS_DIR) -> Iterator[None]:
    """Hold `subnet` for this node while inside; SubnetTaken if another node holds it."""
    # Nodes in namespaces of their own (a local cluster's) may use the same subnet.
    namespace = os.stat("/proc/self/ns/net").st_ino
    claims_dir.mkdir(parents=True, exist_ok=True)
    path = claims_dir / f"{namespace}-{subnet.replace('/', '_')}"
    with open(path, "ab") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SubnetTaken(
                f"another node on this host uses the sandbox subnet {subnet}: "
                "give each node its own net.host_subnet (AENV_NET_HOST_SUBNET)"
            ) from None
        yield
