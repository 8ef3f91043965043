"""The control plane's decisions against nodes that answer, refuse or are gone."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from agentenv.config import Config
from agentenv.control.placement import Wanted
from agentenv.control.plane import ControlPlane
from agentenv.errors import (
    AtCapacity,
    NotFound,
    TemplateBeingBuilt,
    Unavailable,
    error_answer,
)
from agentenv.images.templates import TemplateRecord
from agentenv.state.idempotency import KEY_SHAPE
from agentenv.state.lifecycle import State
from agentenv.state.nodes import NodeCapacity, NodeEvent
from agentenv.state.placements import SETTLE_MARGIN, Placement
from agentenv.state.sandboxes import SandboxRecord, SqlSandboxStore, open_engine

START = datetime(2026, 1, 1, tzinfo=UTC)
BASE = SandboxRecord("x", "base", State.PAUSED, START, START + timedelta(hours=1), 1, 256,
                     4096, 0)  # fmt: skip


async def test_moves_creates_and_lost_nodes(tmp_path: Path, state_url: str) -> None:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.url.host} {request.url.path}")
        if request.url.host == "n1":
            raise httpx.ConnectError("gone", request=request)
        if request.url.path.endswith("/adopt"):
            return httpx.Response(204)
        return httpx.Response(503 if request.url.host == "n2" else 201, json={})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        for name, free in (("n1", 4000), ("n2", 3000), ("n3", 2000), ("lost", 4000)):
            capacity = NodeCapacity(memory_mb=4096, committed_memory_mb=4096 - free)
            await plane.nodes.register(name, f"http://{name}", capacity)
        await plane.nodes.fire("lost", NodeEvent.LOSE)
        on_lost = SqlSandboxStore(engine, "lost")
        for slot, (sandbox_id, state, stored) in enumerate(
            (("kept", State.PAUSED, True), ("gone", State.RUNNING, False))
        ):
            await on_lost.insert(
                dataclasses.replace(
                    BASE, sandbox_id=sandbox_id, state=state, stored=stored, slot=slot
                )
            )

        # The best node (n1) is dead, so the move goes to the next one that answers.
        node = await plane.node_for_operation("kept", {})
        assert node.name == "n2" and calls[:2] == [
            "n1 /sandboxes/kept/adopt",
            "n2 /sandboxes/kept/adopt",
        ]
        # A create skips the dead node and the one refusing for capacity.
        calls.clear()
        created = await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {})
        assert created.status_code == 201
        assert calls == ["n1 /v2/sandboxes", "n2 /v2/sandboxes", "n3 /v2/sandboxes"]
        # What a lost node took with it is forgotten; its stored paused sandbox is not.
        await plane.settle_lost_nodes()
        assert {r.sandbox_id for r in await plane.sandboxes.list_all()} == {"kept"}
        # Its users are told what became of it, and operators can list it.
        with pytest.raises(NotFound, match=r"'gone' was lost with node 'lost' at .*running"):
            await plane.visible_sandbox("gone")
        (lost,) = await plane.lost.list()
        assert (lost.sandbox_id, lost.node, lost.state) == ("gone", "lost", "running")
        with pytest.raises(NotFound, match=r"^sandbox 'never' not found$"):
            await plane.visible_sandbox("never")
    await engine.dispose()


async def test_a_sandbox_being_killed_is_gone_for_users(tmp_path: Path, state_url: str) -> None:
    """As on a node: list and get hide it while its node tears it down."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    engine = await open_engine(state_url)
    async with httpx.AsyncClient() as client:
        plane = ControlPlane(cfg, engine, client)
        store = SqlSandboxStore(engine, "n1")
        await store.insert(dataclasses.replace(BASE, sandbox_id="alive", state=State.RUNNING))
        await store.insert(
            dataclasses.replace(BASE, sandbox_id="dying", state=State.KILLING, slot=1)
        )
        assert [r.sandbox_id for r in await plane.visible_sandboxes()] == ["alive"]
        assert (await plane.visible_sandbox("alive")).sandbox_id == "alive"
        with pytest.raises(NotFound):
            await plane.visible_sandbox("dying")
    await engine.dispose()


async def test_a_create_whose_answer_was_lost_is_asked_again_with_its_key(
    tmp_path: Path, state_url: str
) -> None:
    """The node got the create but its answer never came back (a dropped connection, a
    proxy's 502): the retry carries the same key, so the node answers the first create."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    sent: list[tuple[str, str]] = []
    failures = [httpx.RemoteProtocolError("Server disconnected"), httpx.Response(502)]

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.host, request.headers["idempotency-key"]))
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        if failures:
            failure = failures.pop(0)
            if isinstance(failure, Exception):
                raise failure
            return failure
        return httpx.Response(201, json={"sandboxID": "i1"})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        await plane.nodes.register("n1", "http://n1", NodeCapacity(memory_mb=4096))
        created = await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {})
        assert created.status_code == 201
        # Its own key when the client gave none: one for every attempt.
        (key,) = {key for _, key in sent}
        assert [host for host, _ in sent] == ["n1"] * 3 and KEY_SHAPE.fullmatch(key)
        # The client's key is passed on as it is, to every node tried.
        sent.clear()
        await plane.nodes.register(
            "down", "http://down", NodeCapacity(memory_mb=8192, committed_memory_mb=0)
        )
        await plane.create("/v2/sandboxes", b"{}", {"idempotency-key": "mine"})
        assert sent == [("down", "mine"), ("n1", "mine")]
        # A node that keeps losing answers is asked a bounded number of times.
        sent.clear()
        failures.extend([httpx.ReadError("reset")] * 5)
        with pytest.raises(Unavailable, match="no node answered"):
            await plane.create("/v2/sandboxes", b"{}", {})
        assert [host for host, _ in sent] == ["down", "n1", "n1", "n1"]
    await engine.dispose()


async def test_a_create_from_an_unknown_name_is_the_nodes_404(
    tmp_path: Path, state_url: str
) -> None:
    """A name no template or snapshot has is E2B's 404 through the control plane too: the
    node's answer, not a create tried on every other node."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return httpx.Response(404, json={"code": 404, "message": "template 'gone' not found"})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        for name in ("n1", "n2"):
            await plane.nodes.register(name, f"http://{name}", NodeCapacity(memory_mb=4096))
        created = await plane.create("/v2/sandboxes", b'{"templateID": "gone:v1"}', {})
        assert created.status_code == 404 and len(calls) == 1
        assert created.json()["message"] == "template 'gone' not found"
    await engine.dispose()


async def test_creates_naming_a_pulled_image_go_where_its_disk_is(
    tmp_path: Path, state_url: str
) -> None:
    """A create naming a full image reference starts from the template a node pulled it as:
    placement prefers the node serving that template's disk, as for the template's name."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    taken: collections.Counter[str] = collections.Counter()

    def answer(request: httpx.Request) -> httpx.Response:
        taken[request.url.host] += 1
        return httpx.Response(201, json={})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        ref = "10.200.0.1:5000/fleet/app:v1"
        record = TemplateRecord("app-v1", ref, "sha256:ab", ["base", "top"], 4096)
        plane.templates.save(record)
        for name in ("n1", "n2"):
            layers = ["top"] if name == "n2" else []
            capacity = NodeCapacity(memory_mb=64 * 1024, cores=16, layers=layers)
            await plane.nodes.register(name, f"http://{name}", capacity)
        body = json.dumps({"templateID": ref}).encode()
        for _ in range(3):
            assert (await plane.create("/v2/sandboxes", body, {})).status_code == 201
        assert taken == {"n2": 3}
        # Another registry's image of the same default name is not this template: its
        # creates spread, to the node promised less first.
        other = json.dumps({"templateID": "10.200.0.2:5000/fleet/app:v1"}).encode()
        for _ in range(3):
            assert (await plane.create("/v2/sandboxes", other, {})).status_code == 201
        assert taken == {"n2": 3, "n1": 3}
    await engine.dispose()


async def test_a_template_being_built_is_answered_by_the_first_node(
    tmp_path: Path, state_url: str
) -> None:
    """Nodes share the build's state: the next node would only make the client wait again."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    calls: list[str] = []
    building = error_answer(TemplateBeingBuilt("template 'code-interpreter-v1' is being built"))

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return httpx.Response(503, json=building.body(), headers=building.headers())

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        for name in ("n1", "n2"):
            capacity = NodeCapacity(memory_mb=4096, committed_memory_mb=0)
            await plane.nodes.register(name, f"http://{name}", capacity)
        created = await plane.create("/v2/sandboxes", b'{"templateID": "code-interpreter-v1"}', {})
    assert created.status_code == 503 and created.headers["Retry-After"] == "30"
    assert len(calls) == 1
    await engine.dispose()


async def test_a_burst_of_creates_spreads_before_any_heartbeat(
    tmp_path: Path, state_url: str
) -> None:
    """Every node reports the same free memory and none heartbeats during the burst: the
    placements each create reserves are what the next ones see."""
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    taken: collections.Counter[str] = collections.Counter()

    async def answer(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.01)
        taken[request.url.host] += 1
        return httpx.Response(201, json={})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        names = [f"n{i}" for i in range(10)]
        for name in names:
            capacity = NodeCapacity(memory_mb=64 * 1024, cores=16)
            await plane.nodes.register(name, f"http://{name}", capacity)
        body = b'{"templateID": "base"}'
        await asyncio.gather(*(plane.create("/v2/sandboxes", body, {}) for _ in range(100)))
        assert sorted(taken) == names and set(taken.values()) == {10}
        # Until the nodes heartbeat, their placements count; after, their reports do.
        outstanding = await plane.placements.outstanding()
        assert sum(p.memory_mb for p in outstanding) == 100 * cfg.sandbox.memory_mb
        await asyncio.sleep(SETTLE_MARGIN + 0.05)
        for name in names:
            await plane.nodes.heartbeat(name, NodeCapacity(memory_mb=64 * 1024, cores=16))
        assert await plane.placements.outstanding() == []
        assert await plane.placements.forget_reflected() == 100
    await engine.dispose()


async def test_a_refused_or_failed_create_reserves_nothing(tmp_path: Path, state_url: str) -> None:
    cfg = Config()
    cfg.paths.home = str(tmp_path)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "refuses":
            return httpx.Response(503, json={})
        return httpx.Response(400, json={"code": 400, "message": "bad"})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        await plane.nodes.register("refuses", "http://refuses", NodeCapacity(memory_mb=8192))
        await plane.nodes.register("n1", "http://n1", NodeCapacity(memory_mb=4096))
        answered = await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {})
        assert answered.status_code == 400
        assert await plane.placements.outstanding() == []
    await engine.dispose()


async def test_a_node_at_capacity_spills_to_the_next_and_none_with_room_is_429(
    tmp_path: Path, state_url: str
) -> None:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "busy":
            full = error_answer(AtCapacity("not enough host memory"))
            return httpx.Response(full.status, json=full.body(), headers=full.headers())
        return httpx.Response(201, json={})

    engine = await open_engine(state_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        plane = ControlPlane(cfg, engine, client)
        # "busy" looks the emptier, but its own admission says no.
        await plane.nodes.register("busy", "http://busy", NodeCapacity(memory_mb=8192))
        half_full = NodeCapacity(memory_mb=4096, committed_memory_mb=2048)
        await plane.nodes.register("n1", "http://n1", half_full)
        created = await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {})
        assert created.status_code == 201 and asked == ["busy", "n1"]
        full = NodeCapacity(memory_mb=4096, committed_memory_mb=4096)
        for name in ("busy", "n1"):
            await plane.nodes.heartbeat(name, full)
        with pytest.raises(AtCapacity, match="no node has room") as refused:
            await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {})
        assert error_answer(refused.value).status == 429
    await engine.dispose()


async def test_a_burst_is_decided_from_one_read_a_lone_create_reads_afresh(
    tmp_path: Path, state_url: str
) -> None:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    engine = await open_engine(state_url)
    async with httpx.AsyncClient() as client:
        plane = ControlPlane(cfg, engine, client)
        for name in ("n1", "n2"):
            await plane.nodes.register(name, f"http://{name}", NodeCapacity(memory_mb=8192))
        reads = 0
        real_outstanding = plane.placements.outstanding

        async def counted() -> list[Placement]:
            nonlocal reads
            reads += 1
            return await real_outstanding()

        plane.placements.outstanding = counted  # type: ignore[method-assign]
        wanted = Wanted(memory_mb=512)
        placed = await asyncio.gather(*(plane.placer.place(wanted) for _ in range(20)))
        # The first decision read before the others arrived; the rest share reads (one,
        # unless the database is slower than the view's 50 ms, as on a loaded machine).
        assert 2 <= reads <= 10
        burst_reads = reads
        firsts = collections.Counter(nodes[0].name for nodes, _ in placed)
        assert firsts == {"n1": 10, "n2": 10}
        await plane.nodes.register("n3", "http://n3", NodeCapacity(memory_mb=8192))
        nodes, _ = await plane.placer.place(wanted)
        # A lone decision read afresh: it saw the node that just came.
        assert reads == burst_reads + 1 and nodes[0].name == "n3"
    await engine.dispose()


async def test_hollow_nodes_take_sandboxes_only_where_the_config_accepts_them(
    tmp_path: Path, state_url: str
) -> None:
    """A production control plane (the default config) neither counts nor places on a
    hollow node; one that accepts them does; with no node up a create is a 503."""
    engine = await open_engine(state_url)
    async with httpx.AsyncClient() as client:
        cfg = Config()
        cfg.paths.home = str(tmp_path)
        production = ControlPlane(cfg, engine, client)
        with pytest.raises(Unavailable, match="no node is up"):
            await production.placer.place(Wanted(memory_mb=512))
        hollow = NodeCapacity(memory_mb=8192, hollow=True)
        await production.nodes.register("h1", "http://h1", hollow)
        assert await production.live_nodes() == []
        with pytest.raises(Unavailable, match="no node is up"):
            await production.placer.place(Wanted(memory_mb=512))
        accepting = Config()
        accepting.paths.home = str(tmp_path)
        accepting.cluster.accept_hollow_nodes = True
        bench = ControlPlane(accepting, engine, client)
        assert [n.name for n in await bench.live_nodes()] == ["h1"]
        nodes, _ = await bench.placer.place(Wanted(memory_mb=512))
        assert [n.name for n in nodes] == ["h1"]
    await engine.dispose()
