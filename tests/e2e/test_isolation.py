"""Network isolation from inside real microVMs: the internet answers, nothing else does."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentenv.wire import ENVD_PORT

from ..live import LiveServer, wait_for
from ..netlab import (
    RESOLVED_IP,
    SERVER,
    Lab,
    host_addresses,
    lab,
    probe_command,
    reached,
    serving,
)
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm

GATEWAY = "169.254.0.22"


@pytest.fixture
def around(server: LiveServer) -> Iterator[Lab]:
    with lab(server.network[1]) as made:
        yield made


def probe(server: LiveServer, sandbox: dict[str, Any], targets: list[str]) -> dict[str, str]:
    """PROBE's outcomes from inside the guest."""
    out, err, code = run(server, sandbox, shlex.join(probe_command("python3", targets)))
    assert code == 0, err
    return json.loads(out)


def namespace_ip(server: LiveServer, sandbox_id: str) -> str:
    """The sandbox's namespace address, where the host reaches its guest."""
    addrs = subprocess.run(
        ["ip", "-n", f"{server.prefix}-{sandbox_id}", "-o", "-4", "addr", "show"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = [line.split()[3].split("/")[0] for line in addrs.splitlines()]
    return next(a for a in found if not a.startswith(("127.", "169.254.")))


def serve_in_guest(server: LiveServer, sandbox: dict[str, Any], port: int, reply: str) -> str:
    """Start an HTTP server in the guest; its URL at the namespace address, once it answers."""
    script = shlex.join(["python3", "-c", SERVER, "http", "0.0.0.0", str(port), reply])
    run(server, sandbox, f"nohup {script} >/dev/null 2>&1 &")
    url = f"http://{namespace_ip(server, sandbox['sandboxID'])}:{port}/"

    def answers() -> bool:
        try:
            return httpx.get(url, timeout=2).text == reply
        except httpx.HTTPError:
            return False

    assert wait_for(answers, timeout=30)
    return url


def test_guest_reaches_the_internet_and_nothing_else(
    server: LiveServer, around: Lab, vms: VmFactory
) -> None:
    guest, neighbour = vms.create(server), vms.create(server)
    closed_box = vms.create(server, allow_internet_access=False)
    netns = f"{server.prefix}-{guest['sandboxID']}"
    # The host reaches a guest on any port through its namespace address (so does the
    # proxy, which `run` goes through).
    neighbour_url = serve_in_guest(server, neighbour, 8080, "neighbour")
    neighbour_ip = namespace_ip(server, neighbour["sandboxID"])
    with serving("namespace", netns=netns) as namespace_port:
        closed = [
            # Its own and the neighbour's host-side addresses are among the host's.
            *(around.url("host", address) for address in host_addresses()),
            neighbour_url,
            f"http://{neighbour_ip}:{ENVD_PORT}/health",
            f"http://{GATEWAY}:{namespace_port}/",
            f"http://{namespace_ip(server, guest['sandboxID'])}:{namespace_port}/",
            around.url("private"),
            around.url("metadata"),
        ]
        internet = around.url("internet")
        assert reached(probe(server, guest, [internet, *closed])) == {internet: "internet"}
    assert reached(probe(server, closed_box, [internet])) == {}


def test_operator_allows_a_private_range_and_names_the_resolver(
    fresh_server: LiveServer,
    vms: VmFactory,
) -> None:
    """An allowed range opens a private service but not the host's address inside it; the
    guest's resolver is its gateway, which forwards to the configured server only."""
    with lab(fresh_server.network[1]) as around:
        private_net = IPv4Network(f"{around.private.ip}/30", strict=False)
        fresh_server.extra_env["AENV_NET_ALLOWED_RANGES"] = str(private_net)
        fresh_server.extra_env["AENV_NET_DNS_SERVER"] = around.resolver.ip
        fresh_server.start()
        sandbox = vms.create(fresh_server)
        private, resolve = around.url("private"), f"dns://{GATEWAY}/example.test"
        closed = [
            around.url("host", around.private.host_ip),
            around.url("resolver"),
            f"dns://{around.resolver.ip}/example.test",
        ]
        outcomes = probe(fresh_server, sandbox, [private, resolve, *closed])
        assert reached(outcomes) == {private: "private", resolve: RESOLVED_IP}
        lookup = "python3 -c 'import socket; print(socket.gethostbyname(\"pypi.example\"))'"
        assert run(fresh_server, sandbox, lookup)[0] == f"{RESOLVED_IP}\n"
        kill(fresh_server, sandbox["sandboxID"])


def test_a_second_node_with_the_same_subnet_refuses_to_start(
    fresh_server: LiveServer, vms: VmFactory, tmp_path: Path
) -> None:
    """Its sandboxes' host-side addresses would be the first node's: the host would route
    calls meant for one node's guests to the other's."""
    fresh_server.start()
    twin = vms.own(LiveServer(tmp_path / "twin", network=fresh_server.network))
    twin.home.mkdir()
    with pytest.raises(RuntimeError, match="uses the sandbox subnet"):
        twin.start()
    sandbox = vms.create(fresh_server)
    assert run(fresh_server, sandbox, "echo still mine")[0] == "still mine\n"
    kill(fresh_server, sandbox["sandboxID"])
