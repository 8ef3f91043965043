"""A pause while the guest agent is silent: refused when asked to be strict or for a
filesystem-only pause, else taken and marked (E2B's `envdUnresponsiveAtPause`), and a
memory resume of it is E2B's 409 with `error_code`, which the SDK turns into its own
exception; a resume without memory starts a fresh guest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from e2b import GuestUnresponsiveException
from e2b.api import handle_api_exception
from fastapi import FastAPI

from agentenv.api import sandboxes
from agentenv.api.errors import install_error_handlers
from agentenv.errors import GuestUnresponsiveAtPause, Unavailable

from .fakes import Harness, make_harness


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


class PausingNode:
    """What the sandbox routes use of a node here: its config, manager and pauses."""

    def __init__(self, h: Harness) -> None:
        self.cfg = h.manager.cfg
        self.manager = h.manager
        self.pauses = h.pauses


def _client(h: Harness) -> httpx.AsyncClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(sandboxes.router)
    app.state.node = PausingNode(h)
    app.state.config = h.manager.cfg
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://aenv")


async def test_a_silent_agent_is_refused_when_the_pause_must_not_mark_it(h: Harness) -> None:
    sid = await h.create()
    h.agent.healthy_answer = False
    for strict, memory in ((True, True), (False, False)):
        with pytest.raises(Unavailable, match="guest agent does not answer"):
            await h.pauses.pause(sid, memory=memory, require_healthy_guest=strict)
        assert await h.state(sid) == "running"


async def test_a_marked_pause_resumes_only_without_memory(h: Harness) -> None:
    sid = await h.create()
    h.agent.healthy_answer = False
    await h.pauses.pause(sid)
    record = await h.manager.get(sid)
    assert record.agent_unresponsive_at_pause and record.saved_unresponsive_agent
    async with _client(h) as api:
        shown = (await api.get(f"/sandboxes/{sid}")).json()
        assert shown["state"] == "paused" and shown["envdUnresponsiveAtPause"] is True
        for path in (f"/v2/sandboxes/{sid}/connect", f"/sandboxes/{sid}/resume"):
            refused = await api.post(path, json={"timeout": 60})
            assert refused.status_code == 409
            assert refused.json()["error_code"] == GuestUnresponsiveAtPause.error_code
            assert isinstance(handle_api_exception(refused), GuestUnresponsiveException)
        assert await h.state(sid) == "paused"
        # `on_resume="reboot"`: a fresh guest on its disk, and the mark no longer applies.
        h.agent.healthy_answer = True
        rebooted = await api.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False})
        assert rebooted.status_code == 201
        running = (await api.get(f"/sandboxes/{sid}")).json()
        assert running["state"] == "running" and "envdUnresponsiveAtPause" not in running
    await h.pauses.pause(sid)
    assert not (await h.manager.get(sid)).agent_unresponsive_at_pause
    assert (await h.pauses.resume(sid, 60)).state.runs


async def test_an_agent_that_answered_the_proxy_lately_is_not_asked_again(h: Harness) -> None:
    sid = await h.create()
    h.agent.healthy_answer = False  # it would be marked if it were asked
    route = h.manager.routes.get(sid)
    assert route is not None
    route.agent.answered()
    await h.pauses.pause(sid)
    record = await h.manager.store.get(sid)
    assert record is not None and not record.agent_unresponsive_at_pause
