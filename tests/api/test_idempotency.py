"""`Idempotency-Key` through the real routes, on a node of fakes: a retry answers the first
result, waits for it while it runs, and never creates, forks or resumes twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from agentenv.api import sandboxes
from agentenv.api.errors import install_error_handlers
from agentenv.api.idempotency import NODE, IdempotentOperations
from agentenv.runtime.snapshots.fork import SandboxForks
from agentenv.state.idempotency import SqlKeyStore
from agentenv.vmm.driver import VmmError

from ..runtime.fakes import Harness, make_harness
from .test_error_answers import CreatingNode

BODY = {"templateID": "base", "metadata": {"n": "1"}}


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


@pytest.fixture
async def api(h: Harness) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(IdempotentOperations, role=NODE)
    app.include_router(sandboxes.router)
    node = CreatingNode(h)
    node.forks = SandboxForks(h.manager)  # type: ignore[attr-defined]
    node.pauses = h.pauses  # type: ignore[attr-defined]
    app.state.node = node
    app.state.idempotency = SqlKeyStore(h.manager.store.engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://aenv") as client:
        yield client


def keyed(key: str, api_key: str = "e2b_k") -> dict[str, str]:
    return {"Idempotency-Key": key, "X-API-Key": api_key}


async def test_a_retry_gets_the_first_sandbox(h: Harness, api: httpx.AsyncClient) -> None:
    first = await api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1"))
    # The same JSON in another order is the same request.
    again = await api.post(
        "/v2/sandboxes",
        content=b'{"metadata": {"n": "1"}, "templateID": "base"}',
        headers={**keyed("k-1"), "Content-Type": "application/json"},
    )
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert [r.sandbox_id for r in await h.manager.store.list()] == [first.json()["sandboxID"]]
    # Without a key, or under another API key, it is a new request.
    other = await api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1", "e2b_other"))
    plain = await api.post("/v2/sandboxes", json=BODY)
    assert other.status_code == plain.status_code == 201
    assert len(await h.manager.store.list()) == 3


async def test_a_key_for_another_request_is_refused(h: Harness, api: httpx.AsyncClient) -> None:
    assert (await api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1"))).status_code == 201
    other = await api.post(
        "/v2/sandboxes", json={**BODY, "metadata": {"n": "2"}}, headers=keyed("k-1")
    )
    assert other.status_code == 409
    assert other.json()["code"] == 409 and "k-1" in other.json()["message"]
    # Another route is another request too.
    assert (await api.post("/sandboxes", json=BODY, headers=keyed("k-1"))).status_code == 409
    bad = await api.post("/v2/sandboxes", json=BODY, headers=keyed("Not_A_Key"))
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["message"]
    assert len(await h.manager.store.list()) == 1


async def test_a_retry_while_the_first_runs_waits_for_it(
    h: Harness, api: httpx.AsyncClient
) -> None:
    h.driver.gate["boot"] = asyncio.Event()
    first = asyncio.create_task(api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1")))
    await h.driver.held_at("boot")
    retry = asyncio.create_task(api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1")))
    await asyncio.sleep(0.5)
    assert not retry.done()
    h.driver.gate["boot"].set()
    assert (await retry).json() == (await first).json()
    assert len(await h.manager.store.list()) == 1


async def test_a_failure_a_retry_may_mend_is_not_kept(h: Harness, api: httpx.AsyncClient) -> None:
    h.driver.fail["boot"] = VmmError("qemu exited with 1")
    refused = await api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1"))
    assert refused.status_code == 503 and refused.headers["should-retry"] == "true"
    del h.driver.fail["boot"]
    created = await api.post("/v2/sandboxes", json=BODY, headers=keyed("k-1"))
    assert created.status_code == 201 and "idempotent-replayed" not in created.headers
    # The client's own fault is its answer for good.
    wrong = {"templateID": "base", "autoResume": {"enabled": True}, "autoPauseMemory": False}
    first = await api.post("/v2/sandboxes", json=wrong, headers=keyed("k-2"))
    again = await api.post("/v2/sandboxes", json=wrong, headers=keyed("k-2"))
    assert first.status_code == again.status_code == 400
    assert again.headers["idempotent-replayed"] == "true"
    assert len(await h.manager.store.list()) == 1


async def test_a_fork_and_a_resume_are_not_done_twice(h: Harness, api: httpx.AsyncClient) -> None:
    parent = await h.create()
    forked = await api.post(f"/sandboxes/{parent}/fork", json={}, headers=keyed("fork-1"))
    again = await api.post(f"/sandboxes/{parent}/fork", json={}, headers=keyed("fork-1"))
    assert forked.status_code == again.status_code == 201
    assert again.json() == forked.json() and again.headers["idempotent-replayed"] == "true"
    assert len(await h.manager.store.list()) == 2
    await h.pauses.pause(parent)
    resumed = await api.post(f"/v2/sandboxes/{parent}/connect", json={}, headers=keyed("c-1"))
    # Without its key a second connect would find it running (200); with it, the resume.
    again = await api.post(f"/v2/sandboxes/{parent}/connect", json={}, headers=keyed("c-1"))
    assert resumed.status_code == again.status_code == 201
    assert again.headers["idempotent-replayed"] == "true"
    assert await h.state(parent) == "running"
