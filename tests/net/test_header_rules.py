"""E2B's header rules on real namespaces: a guest's HTTPS requests to a matching host are
answered by the egress proxy under the node's CA, and go on to the real server, verified,
with the rule's headers set; everything else is as without rules."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from contextlib import ExitStack
from ipaddress import IPv4Address
from pathlib import Path

import jwt
import pytest

from agentenv.credentials.identity import IdentitySettings, WorkloadIdentity
from agentenv.credentials.placeholders import Credentials
from agentenv.credentials.sealing import Sealer, derive_key
from agentenv.credentials.vault import SecretVault
from agentenv.net.authority import EgressAuthority
from agentenv.net.egressproxy import EgressProxy, upstream_context
from agentenv.net.netns import apply_policy, ensure_host_forwarding
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import egress_of
from agentenv.net.transforms import normalize_rules
from agentenv.state.credentials import SqlSecretStore, SqlSigningKeyStore
from agentenv.state.sandboxes import open_engine

from ..credentials.test_identity import sandbox as sandbox_record
from ..credentials.test_placeholders import Sandboxes
from ..netlab import Lab, echo_server, peer, random_slash30, serving, sh, site_certificates
from .standin import sandbox

# From the guest: HTTPS requests to `host` over one connection to `ip`:443, verifying the
# server by the CA file given ("none": not verifying); prints the answers' bodies as a JSON
# list, or the failure.
REQUESTS = r"""
import http.client, json, ssl, sys
ip, host, cafile, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
context = ssl.create_default_context(cafile=None if cafile == "none" else cafile)
if cafile == "none":
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
class ToAddress(http.client.HTTPSConnection):
    def connect(self):
        import socket
        self.sock = context.wrap_socket(
            socket.create_connection((ip, 443), timeout=10), server_hostname=host)
try:
    connection = ToAddress(host, 443, context=context, timeout=10)
    answers = []
    for n in range(count):
        headers = {"Authorization": "Bearer guest's own", "X-Request": str(n)}
        connection.request("POST", f"/call/{n}", body=f"body {n}", headers=headers)
        response = connection.getresponse()
        answers.append({"status": response.status, "body": response.read().decode()})
    print(json.dumps(answers))
except (OSError, ssl.SSLError) as exc:
    print(json.dumps("failed: " + type(exc).__name__))
"""


def requests_from(guest: str, ip: str, host: str, cafile: str, count: int = 1) -> object:
    command = [sys.executable, "-c", REQUESTS, ip, host, cafile, str(count)]
    return json.loads(sh("ip", "netns", "exec", guest, *command))


@pytest.fixture(scope="module")
def upstream_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return site_certificates(tmp_path_factory.mktemp("upstream-ca"))


RULES = {
    "api.site.test": [
        {"transform": {"headers": {"authorization": "Bearer from the rule"}}},
        {"transform": {"headers": {"X-Added": "yes"}}},
    ],
    "*.other.test": [{"transform": {"headers": {"X-Wild": "1"}}}],
}


async def test_header_rules_on_https(
    network: tuple[str, str], around: Lab, upstream_ca: tuple[Path, Path], tmp_path: Path
) -> None:
    ca, web_certificate = upstream_ca
    web = around.internet
    authority = EgressAuthority(b"test node key")
    guest_ca = tmp_path / "egress-ca.pem"
    guest_ca.write_text(authority.ca_pem)
    with ExitStack() as stack:
        stack.enter_context(echo_server(web.netns, web_certificate))
        at = stack.enter_context(peer(random_slash30("192.168.202.0/24")))
        stack.enter_context(serving(web.ip, kind="dns", netns=at.netns, address=at.ip, port=53))
        policy = EgressPolicy(dns_server=IPv4Address(at.ip))
        # Header rules over open internet: they grant nothing, and every HTTPS request
        # goes through the proxy.
        rules = egress_of({"rules": normalize_rules(RULES)}, True)
        proxy = EgressProxy(
            lambda address: ("sandbox", rules),
            policy,
            network[1],
            authority=authority,
            upstream_tls=upstream_context(str(ca)),
        )
        ports = await proxy.start()
        try:
            async with sandbox(network, 9, rules=rules) as (plan, guest):
                await ensure_host_forwarding(network[1], network[0], ports)
                await apply_policy(plan, rules, dataclasses.replace(policy, proxy=ports))

                async def call(host: str, cafile: str, count: int = 1) -> object:
                    # Nothing listens at the address dialled: the proxy connects by name.
                    return await asyncio.to_thread(
                        requests_from, guest, "192.0.2.1", host, cafile, count
                    )

                # Two requests on one connection: each gets the rule's headers, the
                # guest's own Authorization replaced whatever its case; the bodies pass.
                answers = await call("api.site.test", str(guest_ca), count=2)
                assert isinstance(answers, list) and len(answers) == 2
                for n, answer in enumerate(answers):
                    seen = json.loads(answer["body"])
                    assert (seen["method"], seen["path"], seen["body"]) == (
                        "POST", f"/call/{n}", f"body {n}"
                    )  # fmt: skip
                    headers = seen["headers"]
                    assert headers["authorization"] == "Bearer from the rule"
                    assert (headers["x-added"], headers["x-request"]) == ("yes", str(n))
                    assert headers["host"] == "api.site.test"
                # A host no rule matches is not intercepted: the real server's certificate
                # (which the guest's CA did not sign) arrives, and no header is added.
                assert (
                    await call("www.site.test", str(guest_ca)) == "failed: SSLCertVerificationError"
                )
                plain = await call("www.site.test", str(ca))
                assert isinstance(plain, list)
                assert "x-added" not in json.loads(plain[0]["body"])["headers"]
                # A matching host whose real certificate does not verify is never served.
                bad = await call("x.other.test", str(guest_ca))
                assert isinstance(bad, str) and bad.startswith("failed")
        finally:
            await proxy.close()
            await ensure_host_forwarding(network[1], network[0])


async def test_an_unresolved_placeholder_is_a_502_not_a_leak(
    network: tuple[str, str], around: Lab, upstream_ca: tuple[Path, Path], tmp_path: Path
) -> None:
    ca, web_certificate = upstream_ca
    authority = EgressAuthority(b"test node key")
    guest_ca = tmp_path / "egress-ca.pem"
    guest_ca.write_text(authority.ca_pem)
    secret_rule = {"api.site.test": [{"transform": {"headers": {"X-Key": "${e2b.secrets.k}"}}}]}
    rules = egress_of({"rules": normalize_rules(secret_rule)}, True)
    with ExitStack() as stack:
        stack.enter_context(echo_server(around.internet.netns, web_certificate))
        at = stack.enter_context(peer(random_slash30("192.168.203.0/24")))
        stack.enter_context(
            serving(around.internet.ip, kind="dns", netns=at.netns, address=at.ip, port=53)
        )
        policy = EgressPolicy(dns_server=IPv4Address(at.ip))
        proxy = EgressProxy(
            lambda address: ("sandbox", rules),
            policy,
            network[1],
            authority=authority,
            upstream_tls=upstream_context(str(ca)),
        )
        ports = await proxy.start()
        try:
            async with sandbox(network, 10, rules=rules) as (plan, guest):
                await ensure_host_forwarding(network[1], network[0], ports)
                await apply_policy(plan, rules, dataclasses.replace(policy, proxy=ports))
                answers = await asyncio.to_thread(
                    requests_from, guest, "192.0.2.1", "api.site.test", str(guest_ca)
                )
                assert isinstance(answers, list)
                assert answers[0]["status"] == 502
                assert "${e2b.secrets.k}" in answers[0]["body"]
        finally:
            await proxy.close()
            await ensure_host_forwarding(network[1], network[0])


async def test_placeholders_resolve_to_hosted_credentials(
    network: tuple[str, str], around: Lab, upstream_ca: tuple[Path, Path], tmp_path: Path
) -> None:
    """A node's credentials as the resolver: the guest's request leaves with the secret's
    value and a token minted for its sandbox, neither of which the guest ever held."""
    engine = await open_engine(f"sqlite:///{tmp_path / 'state.db'}")
    settings = IdentitySettings("https://aenv.example.test", "aenv.example.test", 300, 0, 60)
    sealer = Sealer(derive_key("a node's server key for the test"))
    record = sandbox_record("sandbox")
    credentials = Credentials(
        SecretVault(SqlSecretStore(engine), sealer),
        WorkloadIdentity(SqlSigningKeyStore(engine), sealer, settings),
        Sandboxes(record),
    )
    await credentials.vault.create("k", "s3cr3t-value", {})
    headers = {"X-Key": "${e2b.secrets.K}", "Authorization": "Bearer ${e2b.identity.tokens.aws}"}
    rules = egress_of(
        {"rules": normalize_rules({"api.site.test": [{"transform": {"headers": headers}}]})}, True
    )
    ca, web_certificate = upstream_ca
    authority = EgressAuthority(b"test node key")
    guest_ca = tmp_path / "egress-ca.pem"
    guest_ca.write_text(authority.ca_pem)
    with ExitStack() as stack:
        stack.enter_context(echo_server(around.internet.netns, web_certificate))
        at = stack.enter_context(peer(random_slash30("192.168.204.0/24")))
        stack.enter_context(
            serving(around.internet.ip, kind="dns", netns=at.netns, address=at.ip, port=53)
        )
        policy = EgressPolicy(dns_server=IPv4Address(at.ip))
        proxy = EgressProxy(
            lambda address: ("sandbox", rules),
            policy,
            network[1],
            authority=authority,
            header_values=credentials,
            upstream_tls=upstream_context(str(ca)),
        )
        ports = await proxy.start()
        try:
            async with sandbox(network, 11, rules=rules) as (plan, guest):
                await ensure_host_forwarding(network[1], network[0], ports)
                await apply_policy(plan, rules, dataclasses.replace(policy, proxy=ports))

                async def call() -> list[dict[str, object]]:
                    answers = await asyncio.to_thread(
                        requests_from, guest, "192.0.2.1", "api.site.test", str(guest_ca)
                    )
                    assert isinstance(answers, list)
                    return answers

                seen = json.loads(str((await call())[0]["body"]))["headers"]
                assert seen["x-key"] == "s3cr3t-value"
                token = seen["authorization"].removeprefix("Bearer ")
                keys = jwt.PyJWKSet.from_dict(await credentials.identity.jwks())
                claims = jwt.decode(
                    token,
                    keys[jwt.get_unverified_header(token)["kid"]],
                    algorithms=["ES256"],
                    audience="sts.amazonaws.com",
                )
                assert claims["sub"] == "spiffe://aenv.example.test/sandbox/sandbox"
                # A deleted secret stops its use: the request does not leave.
                await credentials.vault.delete("k")
                refused = (await call())[0]
                assert refused["status"] == 502 and "${e2b.secrets.K}" in str(refused["body"])
        finally:
            await proxy.close()
            await ensure_host_forwarding(network[1], network[0])
            await engine.dispose()
