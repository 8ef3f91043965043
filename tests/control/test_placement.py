"""Placement's order: capacity, then locality, then spread."""

from __future__ import annotations

from agentenv.control.placement import Reserved, Wanted, candidates, load
from agentenv.state.nodes import NodeCapacity, NodeInfo, NodeState

NOW = 1000.0


def node(
    name: str, free: int, state: NodeState = NodeState.ACTIVE, silent: float = 1.0, **held
) -> NodeInfo:
    capacity = NodeCapacity(memory_mb=4096, committed_memory_mb=4096 - free, **held)
    return NodeInfo(name, f"http://{name}", state, capacity, NOW - silent, 0.0)


def names(nodes: list[NodeInfo]) -> list[str]:
    return [n.name for n in nodes]


def test_only_live_active_nodes_with_room_are_candidates() -> None:
    nodes = [
        node("full", 100),
        node("draining", 4000, NodeState.DRAINING),
        node("lost", 4000, NodeState.LOST),
        node("silent", 4000, silent=30),
        node("ok", 600),
    ]
    assert names(candidates(nodes, Wanted(512), NOW, timeout=15)) == ["ok"]


def test_locality_comes_before_spread_within_a_margin() -> None:
    nodes = [
        node("empty", 4000),
        node("has-layer", 3800, layers=["top"]),
        node("has-snapshot", 3700, snapshots=["s:1"]),
        node("full-with-layer", 600, layers=["top"]),
    ]
    assert names(candidates(nodes, Wanted(512), NOW, 15))[0] == "empty"
    wanted = Wanted(512, layers=frozenset({"top"}))
    assert names(candidates(nodes, wanted, NOW, 15))[0] == "has-layer"
    assert names(candidates(nodes, Wanted(512, snapshots=frozenset({"s:1"})), NOW, 15))[0] == (
        "has-snapshot"
    )
    assert names(candidates(nodes, Wanted(512, origin="has-snapshot"), NOW, 15))[0] == (
        "has-snapshot"
    )
    # Past LOCAL_LOAD_LIMIT a node holding the layer competes on free memory only.
    assert names(candidates(nodes, wanted, NOW, 15))[-1] == "full-with-layer"
    # So it does once it is LOCALITY_MARGIN more promised than the least promised node:
    # a burst does not pile onto the nodes whose heartbeat already shows the template.
    ahead = [node("empty", 4000), node("has-layer", 3400, layers=["top"])]
    assert names(candidates(ahead, wanted, NOW, 15)) == ["empty", "has-layer"]
    # A snapshot's files (its whole RAM) are worth more: held to LOCAL_LOAD_LIMIT only.
    ahead = [node("empty", 4000), node("has-snapshot", 2400, snapshots=["s:1"])]
    from_snapshot = Wanted(512, snapshots=frozenset({"s:1"}))
    assert names(candidates(ahead, from_snapshot, NOW, 15))[0] == "has-snapshot"


def test_equal_nodes_are_spread_by_key() -> None:
    nodes = [node(f"n{i}", 2048) for i in range(8)]
    firsts = {names(candidates(nodes, Wanted(512, key=str(k)), NOW, 15))[0] for k in range(40)}
    assert len(firsts) >= 4
    assert names(candidates(nodes, Wanted(512, key="x"), NOW, 15)) == names(
        candidates(nodes, Wanted(512, key="x"), NOW, 15)
    )


def test_placements_since_the_heartbeat_count_against_a_node() -> None:
    nodes = [node("a", 3000), node("b", 2900)]
    assert names(candidates(nodes, Wanted(512), NOW, 15))[0] == "a"
    reserved = {"a": Reserved(memory_mb=512)}
    assert names(candidates(nodes, Wanted(512), NOW, 15, reserved)) == ["b", "a"]
    # Reserved memory is not free: a node it fills is no candidate.
    assert names(candidates(nodes, Wanted(512), NOW, 15, {"a": Reserved(2600)})) == ["b"]


def test_cpu_counts_as_well_as_memory() -> None:
    busy = node("busy-cpu", 4000, cores=2, cpu_load=0.9)
    vcpus = node("many-vcpus", 4000, cores=2, committed_vcpus=7)
    quiet = node("quiet", 2500, cores=2, cpu_load=0.1)
    assert names(candidates([busy, vcpus, quiet], Wanted(512), NOW, 15)) == [
        "quiet",
        "many-vcpus",
        "busy-cpu",
    ]
    assert load(vcpus, Reserved(vcpus=1)) == 1.0
    # A node holding the layer keeps its preference on a busy CPU (reading nothing is
    # what a busy host needs), and loses it once its vCPUs are promised past the limit.
    local = node("local-busy", 4000, layers=["top"], cores=2, cpu_load=0.8)
    wanted = Wanted(512, layers=frozenset({"top"}))
    assert names(candidates([local, quiet], wanted, NOW, 15))[0] == "local-busy"
    full = node("local-full", 4000, layers=["top"], cores=2, committed_vcpus=7)
    assert names(candidates([full, quiet], wanted, NOW, 15))[0] == "quiet"


def test_a_cpu_load_every_node_shares_does_not_hide_what_was_placed() -> None:
    """Nodes on one host report one load average; the reservations still spread."""
    nodes = [node(n, 3500, cores=2, cpu_load=1.3) for n in ("a", "b")]
    assert names(candidates(nodes, Wanted(512), NOW, 15, {"a": Reserved(512, 1)})) == ["b", "a"]
