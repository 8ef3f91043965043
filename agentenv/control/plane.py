"""The control plane's decisions: which node serves a request, moving a paused sandbox
off a lost or draining node, and what a lost node's sandboxes become.

Stateless: everything it knows is in the state store (nodes, sandbox records) and the
object store (templates, snapshots), so several replicas can run behind one address.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import logging
import secrets
import time
import uuid
from collections.abc import Mapping

import httpx
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..api.idempotency import IDEMPOTENCY_KEY
from ..api.models import MAX_METRICS_SANDBOXES, SandboxesWithMetrics, SandboxMetric
from ..config import Config
from ..errors import AtCapacity, InvalidInput, NotFound, TemplateBeingBuilt, Unavailable
from ..images.pull import pulled_template
from ..images.reference import full_reference
from ..images.snapshots import SnapshotRegistry
from ..images.templates import TemplateRecord, TemplateRegistry
from ..state.lifecycle import Event, allows
from ..state.lost import LostSandboxes
from ..state.nodes import NodeInfo, NodeRegistry
from ..state.placements import PlacementLedger
from ..state.sandboxes import SandboxRecord, SqlSandboxStore
from ..storage.objectstore import ObjectStoreError
from ..storage.stores import open_object_store
from .placement import Wanted
from .placer import Placer

log = logging.getLogger(__name__)

# Seconds between checks for silent nodes.
WATCH_INTERVAL = 1.0
# Checks between prunes of old losses.
PRUNE_EVERY = 3600
# Times a create whose answer was lost is sent again (with its key) beyond one per node.
RELAY_RETRIES = 2
# Answers of a proxy between here and a node that lost the node's answer.
_LOST_ON_THE_WAY = (502, 504)
# Seconds a template's placement hint (its size, snapshot or top layer, from the object
# store) is reused: a burst of creates reads the store once; a rebuild counts soon after.
HINT_TTL = 5.0
# Templates whose hints are kept at most (names come from requests).
MAX_HINTS = 1024
# A node's answers that another node may not give: it is full (429) or cannot now (503).
_NO_ROOM = (429, 503)


class ControlPlane:
    """Placement, adoption and node loss over one state store and object store."""

    def __init__(self, cfg: Config, engine: AsyncEngine, client: httpx.AsyncClient) -> None:
        self.cfg = cfg
        self.nodes = NodeRegistry(engine)
        # Every node's records: the control plane owns none.
        self.sandboxes = SqlSandboxStore(engine, node="")
        objects = open_object_store(cfg)
        self.templates = TemplateRegistry(objects)
        self.snapshots = SnapshotRegistry(objects)
        self.placements = PlacementLedger(engine)
        self.placer = Placer(
            self.nodes,
            self.placements,
            cfg.cluster.node_timeout,
            accept_hollow=cfg.cluster.accept_hollow_nodes,
        )
        self.lost = LostSandboxes(engine)
        self.client = client
        # Placement hints by template name, with when they were read.
        self._hints: dict[str, tuple[float, Wanted]] = {}

    # -- where requests go -------------------------------------------------------------

    async def live_nodes(self) -> list[NodeInfo]:
        """Nodes heard from lately that hold sandboxes; hollow ones only where the config
        accepts them (a production control plane never sends work to a node without VMs)."""
        now = time.time()
        timeout = self.cfg.cluster.node_timeout
        return [
            n
            for n in await self.nodes.list()
            if n.state.holds_sandboxes and n.silent_for(now) < timeout and self.placer.serves(n)
        ]

    async def any_node(self) -> NodeInfo:
        """The node that serves what is not a sandbox's (templates, builds, snapshots
        lists): the first live one by name, so a build's later calls find it again."""
        live = [n for n in await self.live_nodes() if n.state.places]
        if not live:
            raise Unavailable("no node is up")
        return live[0]

    async def node_of(self, sandbox_id: str) -> NodeInfo:
        """The node that holds the sandbox, for its data plane: never moves it."""
        record = await self._record(sandbox_id)
        owner = await self.nodes.get(record.node)
        if owner is None or not owner.state.holds_sandboxes:
            raise NotFound(f"sandbox '{sandbox_id}' is not running")
        return owner

    async def node_for_operation(self, sandbox_id: str, headers: Mapping[str, str]) -> NodeInfo:
        """The node an operation on the sandbox goes to. A paused sandbox whose node was
        lost, or is draining, moves to another node first (from the object store)."""
        record = await self._record(sandbox_id)
        owner = await self.nodes.get(record.node)
        movable = record.stored and allows(record.state, Event.ADOPT)
        if owner is not None and owner.state.keeps_movable:
            return owner
        if owner is not None and owner.state.holds_sandboxes and not movable:
            return owner  # it finishes there (a draining node)
        return await self._move(record, headers)

    async def metrics_of(
        self, sandbox_ids: str, headers: Mapping[str, str]
    ) -> SandboxesWithMetrics:
        """`GET /sandboxes/metrics` of each node running some of `sandbox_ids`, merged."""
        ids = [i.strip() for i in sandbox_ids.split(",") if i.strip()]
        if not 0 < len(set(ids)) <= MAX_METRICS_SANDBOXES:
            raise InvalidInput(f"sandbox_ids: 1 to {MAX_METRICS_SANDBOXES} sandbox ids")
        owners = await self.sandboxes.owners(ids)
        by_node: dict[str, list[str]] = {}
        for sandbox_id, node_name in owners.items():
            by_node.setdefault(node_name, []).append(sandbox_id)
        found: dict[str, SandboxMetric] = {}
        for node_name, held in by_node.items():
            node = await self.nodes.get(node_name)
            if node is None or not node.state.holds_sandboxes:
                continue
            answer = await self.client.get(
                f"{node.url}/sandboxes/metrics",
                params={"sandbox_ids": ",".join(held)},
                headers=dict(headers),
            )
            if answer.status_code == 200:
                found |= SandboxesWithMetrics.model_validate(answer.json()).sandboxes
        return SandboxesWithMetrics(sandboxes=found)

    async def visible_sandboxes(self) -> list[SandboxRecord]:
        """Every node's sandboxes as their users see them: one being killed is gone."""
        return [r for r in await self.sandboxes.list_all() if r.state.visible]

    async def visible_sandbox(self, sandbox_id: str) -> SandboxRecord:
        record = await self._record(sandbox_id)
        if not record.state.visible:
            raise NotFound(f"sandbox '{sandbox_id}' not found")
        return record

    async def _record(self, sandbox_id: str) -> SandboxRecord:
        record = await self.sandboxes.get_any(sandbox_id)
        if record is None:
            lost = await self.lost.get(sandbox_id)
            raise NotFound(lost.message if lost else f"sandbox '{sandbox_id}' not found")
        return record

    async def _move(self, record: SandboxRecord, headers: Mapping[str, str]) -> NodeInfo:
        wanted = Wanted(
            memory_mb=record.memory_mb,
            vcpus=record.vcpus,
            key=record.sandbox_id,
            origin=record.node,
        )
        try:
            nodes, placement = await self.placer.place(wanted, exclude=record.node)
        except AtCapacity:
            raise AtCapacity(
                f"sandbox '{record.sandbox_id}': no other node has room for it"
            ) from None
        for index, node in enumerate(nodes):
            if index:
                placement = await self.placer.reserve(node, wanted)
            try:
                answer = await self._call(
                    node, "POST", f"/sandboxes/{record.sandbox_id}/adopt", headers
                )
            except httpx.HTTPError as exc:
                log.warning("node %s could not adopt %s: %s", node.name, record.sandbox_id, exc)
                await self.placer.close(placement, taken=False)
                continue
            await self.placer.close(placement, taken=answer.status_code == 204)
            if answer.status_code == 204:
                log.info(
                    "sandbox %s moved from %s to %s", record.sandbox_id, record.node, node.name
                )
                return node
            if answer.status_code == 409:
                # Another replica moved it meanwhile: go where it went.
                moved = await self._record(record.sandbox_id)
                if moved.node != record.node:
                    return await self.node_for_operation(record.sandbox_id, headers)
            if answer.status_code == 404:
                raise NotFound(_message(answer))
        raise Unavailable(f"sandbox '{record.sandbox_id}': no node could take it")

    async def create(self, path: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """Send a create to the best node with room: the next one when a node has no room
        (429, 503) or cannot be reached; again later when its answer was lost on the
        way. Every attempt carries one idempotency key (the client's, else one of its
        own; nodes share their keys), so a create that reached a node never runs twice.
        Its answer, whatever it is otherwise."""
        wanted = await self._wanted_for_create(body)
        nodes, placement = await self.placer.place(wanted)
        headers = dict(headers)
        if IDEMPOTENCY_KEY.lower() not in {name.lower() for name in headers}:
            headers[IDEMPOTENCY_KEY] = str(uuid.uuid4())
        answer: httpx.Response | None = None
        queue = collections.deque(nodes)
        for attempt_number in range(len(nodes) + RELAY_RETRIES):
            if not queue:
                break
            node = queue.popleft()
            if attempt_number:
                placement = await self.placer.reserve(node, wanted)
            try:
                attempt = await self._call(node, "POST", path, headers, body)
            except httpx.HTTPError as exc:
                log.warning("create on node %s failed: %s", node.name, exc)
                lost = not isinstance(exc, httpx.ConnectError)
            else:
                lost = attempt.status_code in _LOST_ON_THE_WAY
                refused = attempt.status_code in _NO_ROOM
                if (not refused and not lost) or _being_built(attempt):
                    await self.placer.close(placement, taken=attempt.is_success)
                    return attempt
                answer = attempt
            await self.placer.close(placement, taken=False)
            if lost:
                queue.append(node)  # it may have the create: asked again, it answers that
        if answer is None:
            raise Unavailable("no node answered the create")
        return answer

    async def _wanted_for_create(self, body: bytes) -> Wanted:
        sandbox = self.cfg.sandbox
        # Creates of one template spread over equal nodes.
        unknown = Wanted(sandbox.memory_mb, sandbox.vcpus, secrets.token_hex(8))
        try:
            template = json.loads(body).get("templateID")
        except (ValueError, AttributeError):
            return unknown  # the node answers it with a 400
        if not isinstance(template, str):
            return unknown
        now = time.monotonic()
        hint = self._hints.get(template)
        if hint is None or now - hint[0] > HINT_TTL:
            if len(self._hints) >= MAX_HINTS:
                self._hints.clear()
            hint = self._hints[template] = (now, await self._hint_for(template, unknown))
        return dataclasses.replace(hint[1], key=unknown.key)

    async def _hint_for(self, template: str, unknown: Wanted) -> Wanted:
        """What placement should know of `template`: its snapshot, else its size and
        disk's top layer, read from the object store."""
        sandbox = self.cfg.sandbox
        try:
            snapshot = await asyncio.to_thread(self.snapshots.lookup, template)
            if snapshot is not None:
                snapshots = frozenset({snapshot.snapshot_id})
                return dataclasses.replace(unknown, snapshots=snapshots)
            record = await asyncio.to_thread(self._template_for, template)
        except (NotFound, ObjectStoreError):
            return unknown
        if record is None:
            return unknown
        return dataclasses.replace(
            unknown,
            memory_mb=record.memory_mb or sandbox.memory_mb,
            vcpus=record.vcpus or sandbox.vcpus,
            layers=frozenset(record.layers[-1:]),
        )

    def _template_for(self, name: str) -> TemplateRecord | None:
        """The template `name` starts from: a full image reference's is the one a node
        pulled it as (`registry.pull_on_create`)."""
        image = full_reference(name)
        if image is None:
            return self.templates.find(name)
        return pulled_template(self.templates, image)

    async def _call(
        self,
        node: NodeInfo,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes = b"",
    ) -> httpx.Response:
        return await self.client.request(method, node.url + path, headers=headers, content=body)

    # -- node loss ---------------------------------------------------------------------

    async def watch(self) -> None:
        """Declare silent nodes lost and settle their sandboxes, until cancelled."""
        for beat in itertools.count():
            try:
                await self.settle_lost_nodes()
                await self.placements.forget_reflected()
                if beat % PRUNE_EVERY == 0:
                    await self.lost.prune()
            except Exception:
                log.exception("checking for lost nodes failed")
            await asyncio.sleep(WATCH_INTERVAL)

    async def settle_lost_nodes(self) -> None:
        timeout = self.cfg.cluster.node_timeout
        for name in await self.nodes.declare_lost(timeout, self._forget_sandboxes_of):
            log.warning("node %s is lost: it did not heartbeat for %ss", name, timeout)

    async def _forget_sandboxes_of(self, connection: AsyncConnection, lost: list[str]) -> None:
        """In the transaction that declares nodes lost: their sandboxes' VMs (or unsaved
        state) went with them, so the sandboxes are gone, their loss recorded for users
        and operators. A stored paused one stays, to resume elsewhere."""
        gone = [
            record
            for record in await self.sandboxes.on_nodes(lost, connection)
            if not (record.stored and allows(record.state, Event.ADOPT))
        ]
        for sandbox_id in await self.sandboxes.forget(gone, connection) if gone else []:
            log.warning("sandbox %s was lost with its node", sandbox_id)


def _message(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("message", answer.text))
    except ValueError:
        return answer.text


def _being_built(answer: httpx.Response) -> bool:
    """A node's 503 for a template still being built: another node would say the same."""
    try:
        return bool(answer.json().get("error_code") == TemplateBeingBuilt.error_code)
    except (ValueError, AttributeError):
        return False
