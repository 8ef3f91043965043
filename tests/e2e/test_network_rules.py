"""E2B's `network` option with the unmodified SDK, in real microVMs, against namespace hosts
standing in for the internet: egress rules, their update, private ports, the host mask."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from ..live import LiveServer, point_sdk, wait_for
from ..netlab import Lab, lab, peer, probe_command, random_slash30, reached, serving

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]

# Answers each GET with the Host header it received.
HOST_ECHO = """
import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get("Host") or "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
h.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""


@pytest.fixture
def hosts(server: LiveServer) -> Iterator[tuple[Lab, str]]:
    """The lab, and a second internet host's URL."""
    with lab(server.network[1]) as around, peer(random_slash30("198.51.100.0/24")) as other:
        with serving("elsewhere", netns=other.netns) as port:
            yield around, f"http://{other.ip}:{port}/"


def reaches(sandbox: Sandbox, targets: list[str]) -> dict[str, str]:
    out = sandbox.commands.run(shlex.join(probe_command("python3", targets))).stdout
    return reached(json.loads(out))


def test_egress_rules_on_create_and_update(hosts: tuple[Lab, str]) -> None:
    around, elsewhere = hosts
    internet = around.url("internet")
    elsewhere_ip = httpx.URL(elsewhere).host
    sandbox = Sandbox.create(network={"deny_out": [elsewhere_ip]})
    try:
        assert reaches(sandbox, [internet, elsewhere]) == {internet: "internet"}
        assert sandbox.get_info().network == {
            "deny_out": [elsewhere_ip],
            "allow_public_traffic": True,
        }
        # Only what is allowed: an allowed entry wins over all traffic denied.
        sandbox.update_network({"allow_out": [elsewhere_ip], "deny_out": ["0.0.0.0/0"]})
        assert reaches(sandbox, [internet, elsewhere]) == {elsewhere: "elsewhere"}
        # An empty update clears the rules.
        sandbox.update_network({})
        both = {internet: "internet", elsewhere: "elsewhere"}
        assert reaches(sandbox, [internet, elsewhere]) == both
        # Kept across a pause.
        sandbox.update_network({"deny_out": [elsewhere_ip]})
        sandbox.pause()
        sandbox.connect()
        assert reaches(sandbox, [internet, elsewhere]) == {internet: "internet"}
    finally:
        sandbox.kill()


def test_private_ports_and_the_host_mask(server: LiveServer) -> None:
    sandbox = Sandbox.create(
        network={"allow_public_traffic": False, "mask_request_host": "masked.example:${PORT}"}
    )
    try:
        token = sandbox.traffic_access_token
        assert token
        sandbox.commands.run(f"python3 -c {shlex.quote(HOST_ECHO)}", background=True)
        route = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8080"}
        with_token = {**route, "E2b-Traffic-Access-Token": token}

        def served() -> bool:
            return httpx.get(server.url, headers=with_token).status_code == 200

        assert wait_for(served, timeout=30)
        assert httpx.get(server.url, headers=with_token).text == "masked.example:8080"
        refused = httpx.get(server.url, headers=route)
        assert (
            refused.status_code == 403 and "e2b-traffic-access-token" in refused.json()["message"]
        )
        wrong = httpx.get(server.url, headers={**route, "E2b-Traffic-Access-Token": "x"})
        assert wrong.status_code == 403
        # The agent's port keeps its own token: the SDK's calls work as before.
        assert sandbox.commands.run("echo ok").stdout == "ok\n"
    finally:
        sandbox.kill()


def test_bad_rules_are_refused_and_nothing_is_made(server: LiveServer) -> None:
    before = len(Sandbox.list().next_items())
    for network, message in [
        ({"denyOut": ["site.test"]}, "invalid denied CIDR site.test"),
        ({"allowOut": ["*.site.test"], "denyOut": ["198.51.100.8"]}, "include 'ALL_TRAFFIC'"),
        ({"allowOut": ["2001:db8::1"]}, "IPv4 only"),
        ({"egressProxy": {"address": "x"}}, "egressProxy"),
    ]:
        answer = httpx.post(
            f"{server.url}/sandboxes",
            json={"templateID": "base", "network": network},
            headers={"X-API-Key": server.api_key},
        )
        assert answer.status_code == 400 and message in answer.json()["message"], answer.text
    assert len(Sandbox.list().next_items()) == before


def test_allowed_domains(fresh_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over denying all traffic, an allowed domain is reached by name (HTTP Host) through the
    node's egress proxy; another name, and the same host on another port, are not."""
    with lab(fresh_server.network[1]) as around, peer(random_slash30("192.168.202.0/24")) as dns:
        web = around.internet
        with (
            serving("web", netns=web.netns, port=80),
            serving(web.ip, kind="dns", netns=dns.netns, address=dns.ip, port=53),
        ):
            fresh_server.extra_env["AENV_NET_DNS_SERVER"] = dns.ip
            fresh_server.start()
            point_sdk(monkeypatch, fresh_server.url)
            sandbox = Sandbox.create(
                network={"allow_out": ["allowed.test", "*.wild.test"], "deny_out": ["0.0.0.0/0"]}
            )
            try:

                def curl(url: str, *extra: str) -> tuple[int, str]:
                    command = shlex.join(["curl", "-sS", "-m", "10", *extra, url])
                    done = sandbox.commands.run(f'{command}; echo " exit=$?"')
                    body, _, code = done.stdout.rpartition(" exit=")
                    return int(code), body

                assert curl("http://allowed.test/") == (0, "web")
                assert curl("http://api.wild.test/") == (0, "web")
                assert curl("http://other.test/")[0] != 0
                assert curl(f"http://{web.ip}/", "-H", "Host: other.test")[0] != 0
                assert curl(f"http://{web.ip}:{around.ports['internet']}/")[0] != 0
                # Dialling the address with an allowed Host is the name's to answer.
                assert curl(f"http://{web.ip}/", "-H", "Host: allowed.test") == (0, "web")
            finally:
                sandbox.kill()
