"""The isolation rules as text: what namespaces and host chains hold, and in what order."""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest

from agentenv.config import ConfigError, NetConfig
from agentenv.net import policy
from agentenv.net.plan import plan_network
from agentenv.net.policy import (
    BLOCKED_RANGES,
    EgressPolicy,
    EgressPorts,
    egress_policy,
    host_chains,
)
from agentenv.net.rules import DEFAULT_DNS_SERVERS, EgressRules
from agentenv.net.socks import SocksUpstream

PLAN = plan_network(
    3,
    "unit",
    name_prefix="aenvp",
    host_subnet="10.198.0.0/16",
    guest_ip="169.254.0.21",
    guest_gateway="169.254.0.22",
    guest_prefix=30,
)
REJECT = "-j REFUSE"


def _forward(rules: str) -> list[str]:
    return [line for line in rules.splitlines() if line.startswith("-A FORWARD")]


def assert_restorable(rules: str) -> None:
    """iptables-restore takes `rules`: checked in a throwaway namespace, where --test
    parses and checks them without applying anything."""
    checked = subprocess.run(
        ["unshare", "--net", "iptables-restore", "--test"],
        input=rules,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def _node_policy(rules: str) -> list[str]:
    return [line for line in rules.splitlines() if line.startswith("-A NODE-POLICY")]


def _blocked(address: str) -> bool:
    return any(IPv4Address(address) in network for network in BLOCKED_RANGES)


def test_blocked_ranges_cover_private_local_and_reserved_space() -> None:
    for address in (
        "10.1.2.3", "172.16.0.1", "172.31.255.254", "192.168.1.1", "100.64.0.1", "127.0.0.1",
        "169.254.169.254", "169.254.0.22", "0.0.0.0", "224.0.0.251", "239.255.255.250",
        "240.0.0.1", "255.255.255.255", "198.18.0.1", "192.0.0.170",
    ):  # fmt: skip
        assert _blocked(address), address
    # Documentation ranges stand in for the internet; the first addresses past the private
    # and shared ranges are computed, so no public address is named here.
    past_ends = [
        str(IPv4Network(cidr).broadcast_address + 1) for cidr in ("172.16.0.0/12", "100.64.0.0/10")
    ]
    for address in ("192.0.2.1", "198.51.100.7", "203.0.113.10", *past_ends):
        assert not _blocked(address), address


def test_namespace_keeps_the_guest_off_its_own_namespace_and_private_ranges() -> None:
    rules = policy.namespace_rules(PLAN, EgressRules(), EgressPolicy())
    # Refused at once: TCP with a reset (not rate-limited like ICMP), the rest with ICMP.
    assert "-A REFUSE -p tcp -j REJECT --reject-with tcp-reset" in rules
    assert "-A REFUSE -j REJECT --reject-with icmp-admin-prohibited" in rules
    assert f"-A INPUT -i tap0 {REJECT}" in rules
    # The host still reaches the guest on every port through the namespace address.
    assert "-A PREROUTING -i aenvp3n -d 10.198.0.14 -j DNAT --to-destination 169.254.0.21" in rules
    assert _forward(rules) == [
        "-A FORWARD -i tap0 ! -s 169.254.0.21 -j DROP",
        "-A FORWARD -i tap0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        f"-A FORWARD -i tap0 -d 10.198.0.0/16 {REJECT}",
        "-A FORWARD -i tap0 -j NODE-POLICY",
    ]
    assert _node_policy(rules) == [
        *(f"-A NODE-POLICY -d {cidr} {REJECT}" for cidr in BLOCKED_RANGES),
        "-A NODE-POLICY -j ACCEPT",
    ]
    # Without a DNS server the gateway answers nothing: no DNAT from the guest.
    assert "-i tap0 -d 169.254.0.22" not in rules


def test_allowed_ranges_come_before_the_blocks() -> None:
    allowed = (IPv4Network("10.20.0.0/16"), IPv4Network("169.254.169.254/32"))
    node = _node_policy(policy.namespace_rules(PLAN, EgressRules(), EgressPolicy(allowed)))
    opened = [node.index(f"-A NODE-POLICY -d {cidr} -j ACCEPT") for cidr in allowed]
    first_block = node.index(f"-A NODE-POLICY -d 0.0.0.0/8 {REJECT}")
    assert opened[0] < opened[1] < first_block


def test_a_sandboxs_rules_narrow_the_node_policy_and_never_widen_it() -> None:
    """Its allowed ranges win over its denied ones, and both go through the node's policy
    (blocked ranges stay blocked); the server's own subnet is refused before them."""
    rules = EgressRules(
        allow=(IPv4Network("203.0.113.0/28"), IPv4Network("10.0.0.0/8")),
        deny=(IPv4Network("0.0.0.0/0"),),
    )
    forward = _forward(policy.namespace_rules(PLAN, rules, EgressPolicy()))
    assert forward[2:] == [
        f"-A FORWARD -i tap0 -d 10.198.0.0/16 {REJECT}",
        "-A FORWARD -i tap0 -d 203.0.113.0/28 -j NODE-POLICY",
        "-A FORWARD -i tap0 -d 10.0.0.0/8 -j NODE-POLICY",
        f"-A FORWARD -i tap0 -d 0.0.0.0/0 {REJECT}",
        "-A FORWARD -i tap0 -j NODE-POLICY",
    ]
    # No internet with allowed ranges: those alone (and DNS) stay open.
    closed = EgressRules(internet=False, allow=(IPv4Network("203.0.113.0/28"),))
    forward = _forward(policy.namespace_rules(PLAN, closed, EgressPolicy()))
    assert forward[-3:] == [
        "-A FORWARD -i tap0 -d 203.0.113.0/28 -j NODE-POLICY",
        f"-A FORWARD -i tap0 -d 0.0.0.0/0 {REJECT}",
        "-A FORWARD -i tap0 -j NODE-POLICY",
    ]


def test_dns_to_the_gateway_goes_to_the_configured_server() -> None:
    rules = policy.namespace_rules(
        PLAN, EgressRules(), EgressPolicy(dns_server=IPv4Address("10.0.0.2"))
    )
    for proto in ("udp", "tcp"):
        assert (
            f"-A PREROUTING -i tap0 -d 169.254.0.22 -p {proto} --dport 53"
            " -j DNAT --to-destination 10.0.0.2"
        ) in rules
    forward = _forward(rules)
    dns = forward.index(
        "-A FORWARD -i tap0 -m conntrack --ctstate DNAT --ctorigdst 169.254.0.22 -j ACCEPT"
    )
    # Before the blocks: the resolver is usually private; only its DNATed queries pass.
    assert dns < forward.index("-A FORWARD -i tap0 -j NODE-POLICY")


def test_a_domain_allow_list_opens_its_dns_servers_within_the_node_policy() -> None:
    over_all = (IPv4Network("0.0.0.0/0"),)
    domains = EgressRules(deny=over_all, domains=("site.test",))
    forward = _forward(policy.namespace_rules(PLAN, domains, EgressPolicy()))
    # E2B's default server, before the denied ranges, through the node's policy.
    (default,) = DEFAULT_DNS_SERVERS
    opened = forward.index(f"-A FORWARD -i tap0 -d {default} -j NODE-POLICY")
    assert opened < forward.index(f"-A FORWARD -i tap0 -d 0.0.0.0/0 {REJECT}")
    chosen = EgressRules(
        deny=over_all,
        domains=("site.test",),
        dns_servers=(IPv4Address("192.0.2.53"), IPv4Address("10.0.0.53")),
    )
    forward = _forward(policy.namespace_rules(PLAN, chosen, EgressPolicy()))
    assert "-A FORWARD -i tap0 -d 192.0.2.53 -j NODE-POLICY" in forward
    assert "-A FORWARD -i tap0 -d 10.0.0.53 -j NODE-POLICY" in forward  # blocked there
    assert not any(f"-d {default} " in line for line in forward)
    # None chosen, or no domain allowed: no server is opened.
    for rules in (
        EgressRules(deny=over_all, domains=("site.test",), dns_servers=()),
        EgressRules(deny=over_all),
    ):
        text = policy.namespace_rules(PLAN, rules, EgressPolicy())
        assert f"-d {default} " not in text
        assert_restorable(text)


def test_no_internet_rejects_every_new_connection_and_has_no_exceptions() -> None:
    egress = EgressPolicy((IPv4Network("10.20.0.0/16"),), IPv4Address("10.0.0.2"))
    rules = policy.namespace_rules(PLAN, EgressRules(internet=False), egress)
    assert _forward(rules) == [
        "-A FORWARD -i tap0 ! -s 169.254.0.21 -j DROP",
        "-A FORWARD -i tap0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        f"-A FORWARD -i tap0 {REJECT}",
    ]
    assert "--dport 53" not in rules


@pytest.mark.parametrize("allow_internet", [True, False])
def test_iptables_restore_accepts_the_rules(allow_internet: bool) -> None:
    egress = EgressPolicy((IPv4Network("10.20.0.0/16"),), IPv4Address("10.0.0.2"))
    rules = policy.namespace_rules(PLAN, EgressRules(internet=allow_internet), egress)
    assert_restorable(rules)


def test_host_chains_are_per_prefix_and_drop_what_sandboxes_open_on_the_host() -> None:
    chains = {chain.name: chain for chain in host_chains("aenvp", "10.198.0.0/16")}
    assert set(chains) == {"AENVP-INPUT", "AENVP-FORWARD", "AENVP-POSTROUTING"}
    assert chains["AENVP-INPUT"].parent == "INPUT"
    assert chains["AENVP-INPUT"].rules == (
        ("-i", "aenvp+", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"),
        ("-i", "aenvp+", "-j", "DROP"),
    )
    forward = chains["AENVP-FORWARD"].rules
    assert forward[0] == ("-i", "aenvp+", "-o", "aenvp+", "-j", "DROP")
    assert forward[-1] == ("-o", "aenvp+", "-j", "DROP")
    masquerade = chains["AENVP-POSTROUTING"]
    assert (masquerade.table, masquerade.parent) == ("nat", "POSTROUTING")
    assert masquerade.rules == (
        ("-s", "10.198.0.0/16", "!", "-d", "10.198.0.0/16", "-j", "MASQUERADE"),
    )


def test_egress_policy_parses_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    net = NetConfig(allowed_ranges=" 10.20.0.0/16, ,192.168.5.7/32 ", dns_server="10.0.0.2")
    assert egress_policy(net) == EgressPolicy(
        (IPv4Network("10.20.0.0/16"), IPv4Network("192.168.5.7/32")), IPv4Address("10.0.0.2")
    )
    monkeypatch.setattr(policy, "host_dns_server", lambda: IPv4Address("10.255.255.53"))
    assert egress_policy(NetConfig()) == EgressPolicy((), IPv4Address("10.255.255.53"))


@pytest.mark.parametrize(
    "net",
    [
        NetConfig(allowed_ranges="10.0.0.0/33"),
        NetConfig(allowed_ranges="10.0.0.1/8"),
        NetConfig(allowed_ranges="fd00::/8"),
        NetConfig(dns_server="resolver.example"),
    ],
)
def test_egress_policy_refuses_bad_values(net: NetConfig) -> None:
    with pytest.raises(ConfigError, match="net\\."):
        egress_policy(net)


def test_domain_rules_send_http_and_tls_to_the_egress_proxy() -> None:
    """Ports 80 and 443 go to the proxy at the host's end of the veth, but for the allowed
    ranges; only DNATed connections to the proxy's ports pass the subnet's refusal."""
    rules = EgressRules(
        allow=(IPv4Network("198.51.100.0/24"),),
        deny=(IPv4Network("0.0.0.0/0"),),
        domains=("site.test",),
    )
    egress = EgressPolicy(proxy=policy.EgressPorts(http=40080, tls=40443))
    text = policy.namespace_rules(PLAN, rules, egress)
    nat = [line for line in text.splitlines() if line.startswith("-A PREROUTING -i tap0")]
    assert nat == [
        "-A PREROUTING -i tap0 -p tcp --dport 80 -d 198.51.100.0/24 -j RETURN",
        "-A PREROUTING -i tap0 -p tcp --dport 80 -j DNAT --to-destination 10.198.0.13:40080",
        "-A PREROUTING -i tap0 -p tcp --dport 443 -d 198.51.100.0/24 -j RETURN",
        "-A PREROUTING -i tap0 -p tcp --dport 443 -j DNAT --to-destination 10.198.0.13:40443",
    ]
    forward = _forward(text)
    to_proxy = forward.index(
        "-A FORWARD -i tap0 -p tcp -d 10.198.0.13 -m multiport --dports 40080,40443"
        " -m conntrack --ctstate DNAT -j ACCEPT"
    )
    assert to_proxy < forward.index(f"-A FORWARD -i tap0 -d 10.198.0.0/16 {REJECT}")
    # No internet is all traffic denied: its allowed domains still go to the proxy.
    closed = EgressRules(internet=False, domains=("site.test",))
    assert "DNAT --to-destination 10.198.0.13:40443" in policy.namespace_rules(PLAN, closed, egress)
    # Without domains, or before the proxy listens, nothing goes to it.
    assert "DNAT --to-destination 10.198.0.13" not in policy.namespace_rules(
        PLAN, EgressRules(), egress
    )
    assert_restorable(text)
    chains = {c.name: c for c in host_chains("aenvp", "10.198.0.0/16", egress.proxy)}
    assert chains["AENVP-INPUT"].rules[1] == (
        "-i", "aenvp+", "-p", "tcp", "-m", "multiport", "--dports", "40080,40443", "-j", "ACCEPT"
    )  # fmt: skip


@pytest.mark.parametrize("allow_internet", [True, False])
def test_a_sandbox_that_mounts_volumes_reaches_the_nfs_server_and_nothing_more(
    allow_internet: bool,
) -> None:
    egress = EgressPolicy(nfs_server=IPv4Address("10.198.255.254"))
    closed = EgressRules(internet=allow_internet)
    rules = policy.namespace_rules(PLAN, closed, egress, mounts_volumes=True)
    assert (
        "-A PREROUTING -i tap0 -d 169.254.0.22 -p tcp -m multiport --dports 2049,20048"
        " -j DNAT --to-destination 10.198.255.254"
    ) in rules
    forward = _forward(rules)
    # Right after the replies: even a sandbox without internet reaches its volumes.
    assert forward[2] == (
        "-A FORWARD -i tap0 -p tcp -d 10.198.255.254 -m multiport --dports 2049,20048"
        " -m conntrack --ctstate DNAT --ctorigdst 169.254.0.22 -j ACCEPT"
    )
    assert_restorable(rules)
    # A sandbox that mounts nothing has no way there: the host range stays refused.
    plain = policy.namespace_rules(PLAN, closed, egress)
    assert "2049" not in plain


def test_the_nfs_server_answers_sandboxes_only() -> None:
    forward = {c.name: c for c in host_chains("aenvp", "10.198.0.0/16")}["AENVP-FORWARD"].rules
    # After a sandbox's own traffic is accepted, anything else towards it is dropped.
    accept = forward.index(("-i", "aenvp+", "-j", "ACCEPT"))
    assert forward[accept + 1] == ("-o", "nfsaenvp", "-j", "DROP")


def test_a_tunnelled_sandbox_sends_all_its_tcp_to_its_listener() -> None:
    upstream = SocksUpstream("proxy.example.test", 1080)
    rules = EgressRules(deny=(IPv4Network("0.0.0.0/0"),), domains=("site.test",), upstream=upstream)
    text = policy.namespace_rules(
        PLAN, rules, EgressPolicy(dns_server=IPv4Address("10.0.0.2"), proxy=EgressPorts(81, 444))
    )
    nat = [line for line in text.splitlines() if line.startswith("-A PREROUTING -i tap0")]
    # DNS first, then every TCP connection to the listener; the node's proxy is not used.
    assert nat[-1] == "-A PREROUTING -i tap0 -p tcp -j DNAT --to-destination 169.254.0.22:1080"
    assert any("--dport 53" in line for line in nat[:-1])
    assert not any(":81" in line or ":444" in line for line in nat)
    inputs = [line for line in text.splitlines() if line.startswith("-A INPUT")]
    assert inputs == [
        "-A INPUT -i tap0 -p tcp -d 169.254.0.22 --dport 1080 -m conntrack --ctstate DNAT"
        " -j ACCEPT",
        f"-A INPUT -i tap0 {REJECT}",
    ]
    assert_restorable(text)
