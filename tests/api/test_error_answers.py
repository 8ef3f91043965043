"""Failures of host parts reach clients as 503s naming the part, through real routes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from agentenv.api import sandboxes, snapshots
from agentenv.api.errors import install_error_handlers
from agentenv.config import Config
from agentenv.errors import Conflict
from agentenv.images.snapshots import SnapshotRegistry
from agentenv.proxy.router import SandboxProxy
from agentenv.runtime.sandboxes.creation import CreateRequest, SandboxCreations
from agentenv.runtime.sandboxes.routes import Route
from agentenv.state.sandboxes import SandboxRecord
from agentenv.storage.objectstore import ObjectStoreError
from agentenv.vmm.driver import VmmError

from ..runtime.fakes import Harness, make_harness


class CreatingNode:
    """What the create routes use of a node: its config, volumes and `create`."""

    def __init__(self, h: Harness) -> None:
        self.cfg = h.manager.cfg
        self.volumes = None
        self._creations = SandboxCreations(h.manager)

    async def create(self, request: CreateRequest) -> SandboxRecord:
        return await self._creations.create(request)


class UnreachableStore:
    """An object store whose every call fails, as S3 does when its endpoint is down."""

    def __getattr__(self, op: str) -> Callable[..., Any]:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise ObjectStoreError(f"{op} s3://bucket/snapshots/: connection refused")

        return fail


class SnapshotsNode:
    """What the snapshot routes use of a node: its snapshots' registry."""

    def __init__(self) -> None:
        self.snapshots = type("Snapshots", (), {"registry": SnapshotRegistry(UnreachableStore())})


def api(node: object) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(sandboxes.router)
    app.include_router(snapshots.router)
    app.state.node = node
    return app


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://aenv")


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


async def test_a_vmm_that_fails_to_start_is_a_503_naming_the_cause(h: Harness) -> None:
    h.driver.fail["boot"] = VmmError("qemu exited with 1: could not open /dev/kvm")
    async with client(api(CreatingNode(h))) as c:
        answer = await c.post("/sandboxes", json={"templateID": "base"})
    assert answer.status_code == 503
    assert answer.json() == {
        "code": 503,
        "message": "the VMM failed: qemu exited with 1: could not open /dev/kvm",
    }
    # A host part down for now: the SDKs wait and try again.
    assert (answer.headers["retry-after"], answer.headers["should-retry"]) == ("1", "true")
    # The create was undone as any failed create is.
    assert await h.manager.store.list() == [] and not h.driver.alive and not h.networks


async def test_an_object_store_failure_is_a_503_naming_the_store() -> None:
    async with client(api(SnapshotsNode())) as c:
        answer = await c.get("/snapshots")
    assert answer.status_code == 503
    assert answer.json() == {
        "code": 503,
        "message": "the object store failed: list s3://bucket/snapshots/: connection refused",
    }


class ForkingNode:
    """What the fork route uses of a node: its config and forks, which all fail."""

    def __init__(self) -> None:
        self.cfg = Config()
        self.forks = self

    async def fork(self, sandbox_id: str, count: int, timeout: int | None) -> list[Exception]:
        return [VmmError("restore: QEMU refused the state"), Conflict("killed"), KeyError("x")]


async def test_each_failed_fork_has_the_body_an_answer_would_have() -> None:
    async with client(api(ForkingNode())) as c:
        answer = await c.post("/sandboxes/i1/fork", json={"count": 3})
    assert answer.json() == [
        {"error": {"code": 503, "message": "the VMM failed: restore: QEMU refused the state"}},
        {"error": {"code": 409, "message": "killed"}},
        {"error": {"code": 500, "message": "internal error: 'x'"}},
    ]


async def test_a_bug_is_still_a_500() -> None:
    app = api(None)

    @app.get("/broken")
    async def broken() -> None:
        raise KeyError("slot")

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://aenv"
    ) as c:
        answer = await c.get("/broken")
    assert (answer.status_code, answer.json()) == (
        500,
        {"code": 500, "message": "internal error: 'slot'"},
    )
    # A bug answers the same again: the SDKs stop at once.
    assert answer.headers["should-retry"] == "false"


async def test_the_data_plane_answers_a_failed_wake_as_the_api_does() -> None:
    async def wake(sandbox_id: str) -> Route | None:
        raise VmmError(f"{sandbox_id}: QMP did not answer within 10s")

    proxy = SandboxProxy(api(None), resolve=lambda _: None, wake=wake)
    async with client(proxy) as c:
        answer = await c.get(
            "/health", headers={"E2b-Sandbox-Id": "i1", "E2b-Sandbox-Port": "8080"}
        )
    assert answer.status_code == 503
    assert answer.json() == {
        "code": 503,
        "message": "the VMM failed: i1: QMP did not answer within 10s",
    }
    assert answer.headers["should-retry"] == "true"


class _TooManyClients(Exception):
    sqlstate = "53300"


class _Duplicate(Exception):
    sqlstate = "23505"


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (sa.exc.TimeoutError("QueuePool limit reached"), 503),
        (sa.exc.DBAPIError("connect", None, _TooManyClients("too many clients")), 503),
        (sa.exc.OperationalError("select", None, OSError("connection refused")), 503),
        (sa.exc.IntegrityError("insert", None, _Duplicate("duplicate key")), 500),
    ],
)
async def test_a_state_store_that_cannot_serve_now_is_a_503_to_retry(
    raised: Exception, status: int
) -> None:
    """A busy or unreachable store (a full pool, too many clients) is a clean 503 with
    `Retry-After`, as the SDKs retry; a statement that is wrong stays a 500."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise raised

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.get("/boom")
    assert answer.status_code == status
    assert answer.json()["code"] == status
    assert (answer.headers.get("retry-after") == "1") == (status == 503)


class MeteredNode(CreatingNode):
    """A node whose sandbox is killed between its guest's metrics and its VMM's figures."""

    def __init__(self, h: Harness) -> None:
        super().__init__(h)
        self.manager = h.manager
        self.memory = self

    async def host_footprint(self, sandbox_id: str) -> None:
        await self.manager.kill(sandbox_id)
        await self.manager.get(sandbox_id)  # NotFound now, as the real keeper's read is


async def test_a_sandbox_killed_while_its_metrics_are_read_is_left_out(h: Harness) -> None:
    async with client(api(MeteredNode(h))) as c:
        created = await c.post("/sandboxes", json={"templateID": "base"})
        sandbox_id = created.json()["sandboxID"]
        answer = await c.get("/sandboxes/metrics", params={"sandbox_ids": sandbox_id})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sandboxes": {}}
