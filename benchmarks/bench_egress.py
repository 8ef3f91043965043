"""The egress proxy's cost, side by side in one run: a guest's HTTP through the proxy (an
allowed domain) vs. the same server reached straight (an allowed address); and an HTTPS
request a header rule applies to (answered by the proxy, relayed over a second TLS hop)
vs. one it passes through by name.

Real namespaces and rules, with a namespace standing in for the VM (as
`tests/net/test_guest_reach.py` does): no VM, so the ratio is the proxy's alone.
Prints JSON lines: request round trips and download throughput, each direct and proxied,
interleaved, with their ratio; HTTPS round trips on a new connection each and on one kept
connection, rule and pass-through. Run as root from the repository root:
`python -m benchmarks.bench_egress [--runs N] [--mib M]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
from contextlib import ExitStack
from ipaddress import IPv4Address
from pathlib import Path
from tempfile import TemporaryDirectory

import uvloop

from agentenv.net.authority import EgressAuthority
from agentenv.net.egressproxy import EgressProxy, upstream_context
from agentenv.net.netns import (
    create_network,
    destroy_network,
    ensure_host_forwarding,
)
from agentenv.net.plan import plan_network
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import parse_egress
from tests.netlab import (
    echo_server,
    guest_stand_in,
    peer,
    random_slash30,
    remove_host_chains,
    serving,
    sh,
    site_certificates,
    unique,
)

# In the guest: `runs` GETs of /<size> for `host` at `ip`:80; prints each one's seconds.
CLIENT = r"""
import json, socket, sys, time
ip, host, size, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
times = []
for _ in range(runs):
    start = time.perf_counter()
    sock = socket.create_connection((ip, 80), timeout=30)
    sock.sendall(f"GET /{size} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    got = 0
    while chunk := sock.recv(1 << 20):
        got += len(chunk)
    sock.close()
    assert got > size, got
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


# In the guest: `runs` HTTPS GETs of / for `host` at `ip`:443, verified by `cafile`, each on
# a new connection ("new") or all on one ("kept"); prints each one's seconds.
TLS_CLIENT = r"""
import http.client, json, socket, ssl, sys, time
ip, host, cafile, mode, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
context = ssl.create_default_context(cafile=cafile)
class ToAddress(http.client.HTTPSConnection):
    def connect(self):
        raw = socket.create_connection((ip, 443), timeout=30)
        self.sock = context.wrap_socket(raw, server_hostname=host)
connection, times = None, []
for _ in range(runs):
    start = time.perf_counter()
    if connection is None or mode == "new":
        connection = ToAddress(host, 443, context=context)
    connection.request("GET", "/")
    response = connection.getresponse()
    assert response.status == 200 and response.read(), response.status
    if mode == "new":
        connection.close()
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def in_guest(guest: str, ip: str, host: str, size: int, runs: int) -> list[float]:
    out = sh(
        "ip", "netns", "exec", guest, sys.executable, "-c", CLIENT, ip, host, str(size), str(runs)
    )
    return json.loads(out)


def tls_in_guest(guest: str, host: str, cafile: str, mode: str, runs: int) -> list[float]:
    command = [sys.executable, "-c", TLS_CLIENT, "192.0.2.1", host, cafile, mode, str(runs)]
    return json.loads(sh("ip", "netns", "exec", guest, *command))


async def main(runs: int, mib: int) -> None:
    used = sh("ip", "-o", "-4", "addr")
    octet = secrets.choice([n for n in range(190, 250) if f" 10.{n}." not in used])
    prefix, subnet = unique("eb"), f"10.{octet}.0.0/16"
    plan = plan_network(
        1, "bench", name_prefix=prefix, host_subnet=subnet,
        guest_ip="169.254.0.21", guest_gateway="169.254.0.22", guest_prefix=30,
    )  # fmt: skip
    with ExitStack() as stack:
        direct = stack.enter_context(peer(random_slash30("203.0.113.0/24")))
        named = stack.enter_context(peer(random_slash30("198.51.100.0/24")))
        dns = stack.enter_context(peer(random_slash30("192.168.203.0/24")))
        for web in (direct, named):
            stack.enter_context(serving("", kind="bytes", netns=web.netns, port=80))
        stack.enter_context(serving(named.ip, kind="dns", netns=dns.netns, address=dns.ip, port=53))
        policy = EgressPolicy(dns_server=IPv4Address(dns.ip))
        ca, certificate = site_certificates(Path(stack.enter_context(TemporaryDirectory())))
        stack.enter_context(echo_server(named.netns, certificate))
        rule = {"api.site.test": [{"transform": {"headers": {"Authorization": "Bearer x"}}}]}
        rules = parse_egress(
            [f"{direct.ip}/32", "web.test", "*.site.test"], ["0.0.0.0/0"], rules=rule
        )
        authority = EgressAuthority(secrets.token_bytes(32))
        trusted = ca.with_name("guest-trusts.pem")
        trusted.write_text(ca.read_text() + authority.ca_pem)
        proxy = EgressProxy(
            {plan.ns_ip: ("bench", rules)}.get,
            policy,
            subnet,
            authority=authority,
            upstream_tls=upstream_context(str(ca)),
        )
        ports = await proxy.start()
        try:
            await ensure_host_forwarding(subnet, prefix, ports)
            egress = EgressPolicy(policy.allowed_ranges, policy.dns_server, ports)
            await create_network(plan, rules, egress)
            guest = stack.enter_context(guest_stand_in(plan))
            for label, size, count in (
                ("request", 0, runs),
                ("download", mib << 20, max(runs // 10, 3)),
            ):
                timings: dict[str, list[float]] = {"direct": [], "proxied": []}
                for _ in range(count):  # interleaved, one of each at a time
                    timings["direct"] += await asyncio.to_thread(
                        in_guest, guest, direct.ip, "direct", size, 1
                    )
                    timings["proxied"] += await asyncio.to_thread(
                        in_guest, guest, "192.0.2.1", "web.test", size, 1
                    )
                medians = {k: statistics.median(v) for k, v in timings.items()}
                line = {"bench": "egress_proxy", "measure": label, "runs": count}
                if size:
                    line |= {f"{k}_mib_s": round(mib / v, 1) for k, v in medians.items()}
                else:
                    line |= {f"{k}_ms": round(v * 1000, 2) for k, v in medians.items()}
                line["proxied_over_direct_time"] = round(medians["proxied"] / medians["direct"], 2)
                print(json.dumps(line), flush=True)
            for mode, count in (("new", runs), ("kept", runs * 4)):
                timings = {"passed": [], "rule": []}
                for _ in range(max(count // 10, 1)):  # interleaved, ten of each at a time
                    for kind, host in (("passed", "www.site.test"), ("rule", "api.site.test")):
                        timings[kind] += await asyncio.to_thread(
                            tls_in_guest, guest, host, str(trusted), mode, 10
                        )
                medians = {k: statistics.median(v) for k, v in timings.items()}
                line = {"bench": "egress_header_rule", "connection": mode, "runs": count}
                line |= {f"{k}_ms": round(v * 1000, 2) for k, v in medians.items()}
                line["rule_over_passed_time"] = round(medians["rule"] / medians["passed"], 2)
                print(json.dumps(line), flush=True)
        finally:
            await proxy.close()
            stack.close()
            await destroy_network(plan.netns, plan.host_veth)
            remove_host_chains(prefix, subnet)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--mib", type=int, default=64)
    opts = parser.parse_args()
    uvloop.install()  # as the server runs (uvicorn's loop="auto")
    asyncio.run(main(opts.runs, opts.mib))
