"""A network lab on this machine: namespaces standing in for the internet, a private service
or cloud metadata, servers to put in them, and a probe a guest runs. No packet leaves."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path

from agentenv.net.netns import remove_host_forwarding
from agentenv.net.plan import TAP_NAME, NetworkPlan

METADATA_IP = "169.254.169.254"
# What the lab's DNS resolver answers for any name.
RESOLVED_IP = "192.0.2.53"

# Serves `reply` until killed: to HTTP GETs (over TLS too; or GET /<n> answered with n
# bytes), to any UDP datagram, or as the A record of any DNS question. Prints its port
# once it listens.
SERVER = r"""
import http.server, socket, struct, sys
kind, address, port, reply = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]

class Reply(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        # kind "bytes": GET /<n> answers n bytes (for throughput).
        size = int(self.path.strip("/") or 0) if kind == "bytes" else None
        body = reply.encode() if size is None else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if size is None else size))
        self.end_headers()
        self.wfile.write(body)
        while size:
            chunk = min(size, 65536)
            self.wfile.write(b"x" * chunk)
            size -= chunk

    def log_message(self, *args):
        pass

def answer(query):
    end = query.index(b"\0", 12) + 5
    header = query[:2] + b"\x81\x80" + struct.pack(">HHHH", 1, 1, 0, 0)
    record = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(reply)
    return header + query[12:end] + record

if kind in ("http", "https", "bytes"):
    server = http.server.ThreadingHTTPServer((address, port), Reply)
    if kind == "https":  # the certificate and key file follows the reply
        import ssl
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[5])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind((address, port))
print(sock.getsockname()[1], flush=True)
while True:
    data, peer = sock.recvfrom(512)
    sock.sendto(answer(data) if kind == "dns" else reply.encode(), peer)
"""

# Tries every target at once, each with a 3 s timeout, and prints {target: outcome} as JSON:
# the body of an HTTP answer, "http <status>" for an error status, the address a `dns://`
# server gave, "open" for a `tcp://host:port` that accepted a connection, or
# "unreachable: <error>".
PROBE = r"""
import json, socket, struct, sys, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def resolve(server, name):
    query = b"\x12\x34\x01\x00" + struct.pack(">HHHH", 1, 0, 0, 0)
    query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(3)
        sock.sendto(query, (server, 53))
        return socket.inet_ntoa(sock.recv(512)[-4:])

def outcome(target):
    try:
        if target.startswith("dns://"):
            return resolve(*target[6:].split("/", 1))
        if target.startswith("tcp://"):
            host, port = target[6:].rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=3).close()
            return "open"
        with opener.open(target, timeout=3) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        return f"http {exc.code}"
    except Exception as exc:
        return f"unreachable: {exc!r}"

with ThreadPoolExecutor(64) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(outcome, sys.argv[1:])))))
"""


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def unique(prefix: str) -> str:
    """A name no concurrent test run picks: interface names have 15 characters at most."""
    return f"{prefix}{secrets.token_hex(3)}"


def random_slash30(network: str) -> str:
    """A random /30 inside `network` that no route of the host touches (docker0, a VPC...);
    random, so concurrent runs rarely collide."""
    routed = []
    for line in sh("ip", "-o", "-4", "route", "show", "table", "all").splitlines():
        # A route's type ("local", "broadcast", "unreachable"...) may precede its destination.
        words = line.split()
        destination = words[0] if words[0][0].isdigit() else words[1]
        if destination[0].isdigit():
            routed.append(IPv4Network(destination, strict=False))
    free = [
        subnet
        for subnet in IPv4Network(network).subnets(new_prefix=30)
        if not any(subnet.overlaps(route) for route in routed)
    ]
    if not free:
        raise RuntimeError(f"every /30 of {network} is routed on this host")
    return str(secrets.choice(free))


def remove_namespace(netns: str) -> None:
    if Path("/run/netns", netns).exists():
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)


def remove_link(name: str) -> None:
    if Path("/sys/class/net", name).exists():
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def remove_host_chains(name_prefix: str, host_subnet: str) -> None:
    """Undo `ensure_host_forwarding` for one prefix: jumps, rules and chains."""
    remove_host_forwarding(host_subnet, name_prefix)


def host_addresses() -> list[str]:
    """Every IPv4 address of the host outside loopback (a guest's 127/8 is its own)."""
    found = []
    for line in sh("ip", "-o", "-4", "addr", "show").splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            found.append(address)
    return found


@dataclass(frozen=True)
class Peer:
    """A namespace joined to the host by a veth /30: `host_ip` on the host, `ip` inside."""

    netns: str
    host_veth: str
    host_ip: str
    ip: str


@contextmanager
def peer(network: str) -> Iterator[Peer]:
    """A namespace at .2 of the /30 `network`, routed from the host at .1 (not through its
    default route); removed afterwards, whatever happened."""
    subnet = IPv4Network(network)
    made = Peer(unique("labns-"), unique("lab"), str(subnet[1]), str(subnet[2]))
    try:
        sh("ip", "netns", "add", made.netns)
        veth_pair = ["type", "veth", "peer", "name", "eth0", "netns", made.netns]
        sh("ip", "link", "add", made.host_veth, *veth_pair)
        sh("ip", "addr", "add", f"{made.host_ip}/30", "dev", made.host_veth)
        sh("ip", "link", "set", made.host_veth, "up")
        sh("ip", "-n", made.netns, "addr", "add", f"{made.ip}/30", "dev", "eth0")
        sh("ip", "-n", made.netns, "link", "set", "eth0", "up")
        sh("ip", "-n", made.netns, "link", "set", "lo", "up")
        yield made
    finally:
        remove_namespace(made.netns)
        remove_link(made.host_veth)


@contextmanager
def metadata_service(at: Peer, sandbox_subnet: str) -> Iterator[str]:
    """Cloud metadata's address inside `at`, for traffic from `sandbox_subnet` only (a policy
    route), so a guest that got through would reach this machine, never the real one."""
    table = str(secrets.choice(range(10_000, 30_000)))
    rule = ["from", sandbox_subnet, "to", METADATA_IP, "table", table, "priority", table]
    try:
        sh("ip", "-n", at.netns, "addr", "add", f"{METADATA_IP}/32", "dev", "eth0")
        sh("ip", "route", "add", METADATA_IP, "dev", at.host_veth, "table", table)
        sh("ip", "rule", "add", *rule)
        yield METADATA_IP
    finally:
        subprocess.run(["ip", "rule", "del", *rule], check=False, capture_output=True)
        subprocess.run(["ip", "route", "flush", "table", table], check=False, capture_output=True)


@contextmanager
def serving(
    reply: str,
    *,
    kind: str = "http",
    address: str = "0.0.0.0",
    port: int = 0,
    netns: str = "",
    certificate: str = "",
) -> Iterator[int]:
    """A SERVER answering `reply` (in `netns`, if given) until the block ends; yields its
    port. `kind` "https" needs a `certificate` file (certificate and key, PEM)."""
    command = [sys.executable, "-c", SERVER, kind, address, str(port), reply, certificate]
    if netns:
        command = ["ip", "netns", "exec", netns, *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server {kind} on {address}:{port} did not start")
        yield int(line)
    finally:
        proc.kill()
        proc.wait()


def probe_command(python: str, targets: list[str]) -> list[str]:
    """The command running PROBE over `targets` with the interpreter `python`."""
    return [python, "-c", PROBE, *targets]


def reached(outcomes: dict[str, str]) -> dict[str, str]:
    """The targets a PROBE got an answer from, with the answer."""
    return {target: got for target, got in outcomes.items() if not got.startswith("unreachable")}


@dataclass(frozen=True)
class Lab:
    """Around the host: an internet host, a private service with cloud metadata behind it, a
    private DNS resolver, and a server on all the host's addresses; `ports` by those names."""

    internet: Peer
    private: Peer
    resolver: Peer
    ports: dict[str, int]

    def url(self, name: str, address: str = "") -> str:
        """The HTTP server `name` at its own address, or at `address`."""
        own = {"internet": self.internet.ip, "private": self.private.ip}
        own |= {"resolver": self.resolver.ip, "metadata": METADATA_IP, "host": "127.0.0.1"}
        return f"http://{address or own[name]}:{self.ports[name]}/"


@contextmanager
def lab(sandbox_subnet: str) -> Iterator[Lab]:
    """The lab, with metadata routed to it for `sandbox_subnet`; each server replies its name."""
    with ExitStack() as stack:
        internet = stack.enter_context(peer(random_slash30("203.0.113.0/24")))
        private = stack.enter_context(peer(random_slash30("172.16.0.0/16")))
        # Not 172.17/16: a Docker engine's bridge takes it whole.
        resolver = stack.enter_context(peer(random_slash30("192.168.200.0/24")))
        metadata = stack.enter_context(metadata_service(private, sandbox_subnet))
        ports = {
            "host": stack.enter_context(serving("host")),
            "internet": stack.enter_context(serving("internet", netns=internet.netns)),
            "private": stack.enter_context(serving("private", netns=private.netns)),
            "resolver": stack.enter_context(serving("resolver", netns=resolver.netns)),
            "metadata": stack.enter_context(
                serving("metadata", netns=private.netns, address=metadata, port=80)
            ),
        }
        stack.enter_context(
            serving(RESOLVED_IP, kind="dns", netns=resolver.netns, address=resolver.ip, port=53)
        )
        yield Lab(internet, private, resolver, ports)


@contextmanager
def guest_stand_in(plan: NetworkPlan) -> Iterator[str]:
    """The sandbox's tap replaced by a veth to a namespace at the guest's address: a guest
    without a VM. Yields that namespace; removed afterwards."""
    guest = f"{plan.netns}-guest"
    try:
        sh("ip", "netns", "add", guest)
        inside = ["ip", "-n", plan.netns]
        sh(*inside, "link", "del", TAP_NAME)
        sh(*inside, "link", "add", TAP_NAME, "type", "veth", "peer", "name", "eth0", "netns", guest)
        sh(*inside, "addr", "add", f"{plan.guest_gateway}/{plan.guest_prefix}", "dev", TAP_NAME)
        sh(*inside, "link", "set", TAP_NAME, "up")
        sh("ip", "-n", guest, "addr", "add", f"{plan.guest_ip}/{plan.guest_prefix}", "dev", "eth0")
        sh("ip", "-n", guest, "link", "set", "eth0", "up")
        sh("ip", "-n", guest, "link", "set", "lo", "up")
        sh("ip", "-n", guest, "route", "add", "default", "via", plan.guest_gateway)
        yield guest
    finally:
        remove_namespace(guest)


# Answers every request with the JSON of what it got: method, path, headers and body;
# over TLS with the certificate file given; "hashed": header values as their SHA-256 (so a
# secret sent is recognised, not handed back). Prints its port once it listens.
ECHO = r"""
import hashlib, http.server, json, ssl, sys
def shown(value):
    return hashlib.sha256(value.encode()).hexdigest() if sys.argv[2] == "hashed" else value
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path,
                           "headers": {k.lower(): shown(v) for k, v in self.headers.items()},
                           "body": self.rfile.read(length).decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Echo)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(443, flush=True)
server.serve_forever()
"""


def site_certificates(at: Path) -> tuple[Path, Path]:
    """In `at`: a CA, and a certificate of it for api.site.test and *.site.test followed by
    its key (one PEM file)."""
    ca_key, ca, web = at / "ca.key", at / "ca.pem", at / "web.pem"
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
       "-nodes", "-days", "1", "-subj", "/CN=test upstream CA", "-keyout", str(ca_key),
       "-out", str(ca))  # fmt: skip
    request = subprocess.run(
        ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-subj", "/CN=api.site.test", "-keyout", str(at / "web.key")],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    extensions = at / "san.ext"
    extensions.write_text("subjectAltName=DNS:api.site.test,DNS:*.site.test\n")
    signed = subprocess.run(
        ["openssl", "x509", "-req", "-CA", str(ca), "-CAkey", str(ca_key), "-days", "1",
         "-extfile", str(extensions)],
        input=request, capture_output=True, check=True,
    ).stdout  # fmt: skip
    web.write_bytes(signed + (at / "web.key").read_bytes())
    return ca, web


@contextmanager
def echo_server(netns: str, certificate: Path, *, hashed: bool = False) -> Iterator[None]:
    """ECHO on port 443 of `netns` until the block ends."""
    shown = "hashed" if hashed else "plain"
    command = ["ip", "netns", "exec", netns, sys.executable, "-c", ECHO, str(certificate), shown]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        yield
    finally:
        proc.kill()
        proc.wait()


# microsocks's port, and stunnel's in front of it.
SOCKS_PORT, SOCKS_TLS_PORT = 1080, 1443


@contextmanager
def socks_server(
    at: Peer, dns: str, log: Path, hosts: dict[str, str] | None = None
) -> Iterator[None]:
    """microsocks in `at`'s namespace, with a user; it resolves names with `dns` (if any)
    and `hosts`."""
    etc = Path("/etc/netns") / at.netns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "resolv.conf").write_text(f"nameserver {dns}\n" if dns else "")
    (etc / "hosts").write_text("".join(f"{ip} {name}\n" for name, ip in (hosts or {}).items()))
    command = ["ip", "netns", "exec", at.netns, "microsocks", "-i", "0.0.0.0"]
    command += ["-p", str(SOCKS_PORT), "-u", "agent", "-P", "s3cret"]
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.3)
        yield
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(etc, ignore_errors=True)


@contextmanager
def tls_in_front(at: Peer, certificate: Path, workdir: Path) -> Iterator[None]:
    """stunnel in `at`'s namespace: TLS on SOCKS_TLS_PORT, to microsocks inside."""
    config = workdir / "stunnel.conf"
    config.write_text(
        f"foreground = yes\npid =\n[socks]\naccept = 0.0.0.0:{SOCKS_TLS_PORT}\n"
        f"connect = 127.0.0.1:{SOCKS_PORT}\ncert = {certificate}\n"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", at.netns, "stunnel", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()
