"""E2B's header rules with the unmodified SDK, in real microVMs: a guest's HTTPS requests to
a matching host carry the rule's headers, the guest trusting the node's CA with its usual
tools; rules change live, and grant no access."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2b import Sandbox

from ..live import TEST_KEY, LiveServer
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


@pytest.fixture
def lab_server(
    fresh_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LiveServer, Lab, Path]]:
    """A server whose guests resolve every name to the lab's internet host, which serves
    HTTPS under a test CA the server's egress proxy trusts; and that CA's file."""
    ca, certificate = site_certificates(tmp_path)
    with lab(fresh_server.network[1]) as around, peer(random_slash30("192.168.204.0/24")) as dns:
        web = around.internet
        with (
            echo_server(web.netns, certificate),
            serving(web.ip, kind="dns", netns=dns.netns, address=dns.ip, port=53),
        ):
            fresh_server.extra_env["AENV_NET_DNS_SERVER"] = dns.ip
            fresh_server.extra_env["AENV_NET_EGRESS_TRUSTED_CAS"] = str(ca)
            fresh_server.start()
            monkeypatch.setenv("E2B_API_URL", fresh_server.url)
            monkeypatch.setenv("E2B_SANDBOX_URL", fresh_server.url)
            monkeypatch.setenv("E2B_API_KEY", TEST_KEY)
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
