"""Listening sockets inside a sandbox's network namespace, made by the node's process from
a thread of its own that enters the namespace (a socket stays in the namespace it was made
in), and the destination a connection DNATed to one had asked for."""

from __future__ import annotations

import ctypes
import socket
import threading
from ipaddress import IPv4Address

from .netns import NETNS_DIR

_CLONE_NEWNET = 0x40000000
# linux/netfilter_ipv4.h: the destination a connection had before the namespace's DNAT.
_SO_ORIGINAL_DST = 80


def enter_namespace(netns: str) -> None:
    """Move the calling thread (only it) into network namespace `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(NETNS_DIR / netns) as namespace:
        if libc.setns(namespace.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter network namespace {netns}")


def listen_in(netns: str, address: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening at `address`:`port` inside `netns`."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        # This thread ends here: no other work ever runs in the namespace it entered.
        try:
            enter_namespace(netns)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.listen(256)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            made.append(sock)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=make, name=f"listen-in-{netns}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


def original_destination(sock: socket.socket) -> tuple[IPv4Address, int]:
    """Where the guest sent the connection `sock` accepted, before it was DNATed."""
    raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    return IPv4Address(raw[4:8]), int.from_bytes(raw[2:4], "big")
