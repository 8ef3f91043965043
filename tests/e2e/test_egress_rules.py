"""E2B's header rules with the unmodified SDK, in real microVMs: a guest's HTTPS requests to
a matching host carry the rule's headers, the guest trusting the node's CA with its usual
tools; rules change live, and grant no access."""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2b import Sandbox, Secret

from ..live import LiveServer, point_sdk
from ..netlab import (
    SOCKS_PORT,
    Lab,
    echo_server,
    lab,
    peer,
    random_slash30,
    serving,
    sh,
    site_certificates,
    socks_server,
)

pytestmark = [pytest.mark.vm]


@pytest.fixture(params=[False])
def lab_server(
    fresh_server: LiveServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[LiveServer, Lab, Path]]:
    """A server whose guests resolve every name to the lab's internet host, which serves
    HTTPS under a test CA the server's egress proxy trusts (echoing header values, or
    their SHA-256 when the parameter is true); and that CA's file."""
    ca, certificate = site_certificates(tmp_path)
    with lab(fresh_server.network[1]) as around, peer(random_slash30("192.168.204.0/24")) as dns:
        web = around.internet
        with (
            echo_server(web.netns, certificate, hashed=request.param),
            serving(web.ip, kind="dns", netns=dns.netns, address=dns.ip, port=53),
        ):
            fresh_server.extra_env["AENV_NET_DNS_SERVER"] = dns.ip
            fresh_server.extra_env["AENV_NET_EGRESS_TRUSTED_CAS"] = str(ca)
            fresh_server.start()
            point_sdk(monkeypatch, fresh_server.url)
            yield fresh_server, around, ca


def seen_by_server(sandbox: Sandbox, tool: str, url: str, *extra: str) -> dict[str, str]:
    """The headers the lab's server got for a GET of `url` the guest made with `tool`."""
    python = f"import urllib.request as u; print(u.urlopen({url!r}).read().decode())"
    command = {
        "curl": ["curl", "-sS", "-m", "20", *extra, url],
        "python": ["python3", "-c", python],
    }[tool]
    done = sandbox.commands.run(shlex.join(command), timeout=60)
    return dict(json.loads(done.stdout)["headers"])


def test_header_rules_apply_to_https_and_change_live(
    lab_server: tuple[LiveServer, Lab, Path],
) -> None:
    site_ca = lab_server[2]
    rules = {"api.site.test": [{"transform": {"headers": {"Authorization": "Bearer rule"}}}]}
    sandbox = Sandbox.create(network={"rules": rules})
    try:
        for tool in ("curl", "python"):
            headers = seen_by_server(sandbox, tool, "https://api.site.test/")
            assert headers["authorization"] == "Bearer rule", tool
        # Another name on the same server: no rule, so the server's own certificate
        # (which its CA verifies), and no header added.
        sandbox.files.write("/tmp/site-ca.pem", site_ca.read_text())
        other = seen_by_server(
            sandbox, "curl", "https://www.site.test/", "--cacert", "/tmp/site-ca.pem"
        )
        assert "authorization" not in other
        assert sandbox.get_info().network["rules"] == rules  # type: ignore[index]
        # Replaced live: the new rule applies to the next request, the old one is gone.
        wild = {"*.site.test": [{"transform": {"headers": {"X-Team": "blue"}}}]}
        sandbox.update_network({"rules": wild})
        headers = seen_by_server(sandbox, "curl", "https://api.site.test/")
        assert headers["x-team"] == "blue" and "authorization" not in headers
        # Rules grant no access: over all traffic denied, the host stays closed.
        sandbox.update_network({"rules": wild, "deny_out": ["0.0.0.0/0"]})
        done = sandbox.commands.run(
            "curl -sS -m 10 https://api.site.test/; echo exit=$?", timeout=60
        )
        assert "exit=0" not in done.stdout
    finally:
        sandbox.kill()


def test_egress_through_a_socks5_proxy_across_a_pause(
    lab_server: tuple[LiveServer, Lab, Path], tmp_path: Path
) -> None:
    """All allowed TCP goes through the user's SOCKS5 server (by name for an allowed
    domain); the tunnel is back after a pause; an update without the proxy goes straight."""
    _, around, _ = lab_server
    web = around.internet
    with ExitStack() as stack:
        stack.enter_context(serving("web", netns=web.netns, port=80))
        socks = stack.enter_context(peer(random_slash30("198.51.100.0/24")))
        sh("ip", "-n", socks.netns, "route", "add", f"{web.ip}/32", "via", socks.host_ip)
        sh("ip", "-n", web.netns, "route", "add", f"{socks.ip}/32", "via", web.host_ip)
        log = tmp_path / "socks.log"
        # Names resolve in the proxy's namespace to the web host, as the lab's DNS does.
        stack.enter_context(socks_server(socks, "", log, hosts={"api.site.test": web.ip}))
        network = {
            "allow_out": [web.ip, "api.site.test"],
            "deny_out": ["0.0.0.0/0"],
            "egress_proxy": {
                "address": f"{socks.ip}:{SOCKS_PORT}", "username": "agent", "password": "s3cret"
            },
        }  # fmt: skip
        sandbox = Sandbox.create(network=network)
        try:

            def curl(url: str) -> str:
                done = sandbox.commands.run(f"curl -sS -m 10 {url}; echo ' exit='$?", timeout=60)
                return done.stdout.strip()

            assert curl(f"http://{web.ip}/") == "web exit=0"
            assert curl("http://api.site.test/") == "web exit=0"
            assert f"connected to {web.ip}:80" in log.read_text()
            assert "connected to api.site.test:80" in log.read_text()
            info = sandbox.get_info().network or {}
            assert "password" not in str(info) and "s3cret" not in str(info)
            sandbox.pause()
            sandbox.connect()
            before = log.read_text().count("connected to")
            assert curl(f"http://{web.ip}/") == "web exit=0"
            assert log.read_text().count("connected to") == before + 1
            # Without the proxy: straight out, the proxy not asked.
            sandbox.update_network({"allow_out": [web.ip], "deny_out": ["0.0.0.0/0"]})
            assert curl(f"http://{web.ip}/") == "web exit=0"
            assert log.read_text().count("connected to") == before + 1
        finally:
            sandbox.kill()


SECRET = "sk-live-" + secrets.token_hex(16)


@pytest.mark.parametrize("lab_server", [True], indirect=True)
def test_a_secret_is_used_at_egress_and_never_enters_the_guest(
    lab_server: tuple[LiveServer, Lab, Path],
) -> None:
    """The server gets the secret (it answers only its hash); the guest's memory and disk,
    searched after the request, do not hold it; deleting the secret stops its use."""
    server = lab_server[0]
    Secret.create("api-token", SECRET)
    header = f"Bearer {Secret.fill('api-token')}"
    rules = {"api.site.test": [{"transform": {"headers": {"Authorization": header}}}]}
    sandbox = Sandbox.create(network={"rules": rules})
    try:
        seen = seen_by_server(sandbox, "curl", "https://api.site.test/")
        assert seen["authorization"] == hashlib.sha256(f"Bearer {SECRET}".encode()).hexdigest()
        # Markers the search must find, so not finding the secret means something: one
        # in a file on the guest's disk, one in a guest process's memory.
        on_disk, in_memory = "disk-" + secrets.token_hex(12), "ram-" + secrets.token_hex(12)
        sandbox.files.write("/root/marker", on_disk)
        holder = (
            f"import time; x = {in_memory[:4]!r} + {in_memory[4:]!r};"
            " open('/tmp/held', 'w').close(); time.sleep(600)"
        )
        sandbox.commands.run(shlex.join(["python3", "-c", holder]), background=True)
        sandbox.commands.run("until [ -e /tmp/held ]; do sleep 0.1; done", timeout=60)
        sandbox.commands.run("sync")
        sandbox.pause()
        found = _search(
            server.home / "sandboxes" / sandbox.sandbox_id, [on_disk, in_memory, SECRET]
        )
        assert found[on_disk] and found[in_memory], found
        assert not found[SECRET], found
        sandbox.connect()
        Secret.destroy("api-token")
        done = sandbox.commands.run("curl -sS -m 10 https://api.site.test/", timeout=60)
        assert "api-token" in done.stdout and "authorization" not in done.stdout
    finally:
        sandbox.kill()


def _search(directory: Path, needles: list[str]) -> dict[str, bool]:
    """Which of `needles` occur in any file under `directory` (a paused sandbox's memory
    and disk images), read in overlapping pieces."""
    found = dict.fromkeys(needles, False)
    overlap = max(len(n) for n in needles)
    for path in (p for p in directory.rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            tail = b""
            while piece := fh.read(16 << 20):
                window = tail + piece
                for needle in needles:
                    found[needle] = found[needle] or needle.encode() in window
                tail = window[-overlap:]
    return found
