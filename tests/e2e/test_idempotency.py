"""Retries that never duplicate, through the unmodified E2B SDK and a fault injector: a lost
answer, a retry while the first runs, a key reused, a node's answer lost on its way to
the control plane, a server killed mid-create, and whether a 503 is worth retrying."""

from __future__ import annotations

import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from ..faultproxy import DROP, LOSE, PASS, FaultProxy, first_create
from ..live import TEST_KEY, LiveServer, wait_for
from ..vmfactory import VmFactory

pytestmark = pytest.mark.vm

CREATES = ("POST", "/v2/sandboxes")


def _sdk_to(monkeypatch: pytest.MonkeyPatch, api_url: str, sandbox_url: str) -> None:
    monkeypatch.setenv("E2B_API_URL", api_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", sandbox_url)
    monkeypatch.setenv("E2B_API_KEY", TEST_KEY)


def _key(name: str) -> str:
    return f"{name}-{secrets.token_hex(4)}"


def _created(body: bytes) -> str:
    return str(json.loads(body)["sandboxID"])


def test_a_lost_answer_is_retried_into_the_first_sandbox(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server created the sandbox, the client got 502 instead: the SDK's retry (same
    key) is answered with that sandbox, and no second one is made."""
    before = server.sandbox_ids()
    with FaultProxy(server.url, first_create(LOSE)) as injector:
        _sdk_to(monkeypatch, injector.url, server.url)
        sandbox = Sandbox.create(idempotency_key=_key("lost"))
    first, retry = injector.of(*CREATES)
    assert (first.fault, retry.fault) == (LOSE, PASS)
    assert sandbox.sandbox_id == _created(first.body)
    assert retry.answer_headers["idempotent-replayed"] == "true"
    assert server.sandbox_ids() - before == {sandbox.sandbox_id}


def test_a_retry_while_the_first_runs_waits_for_it(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = server.sandbox_ids()
    key = _key("in-flight")
    with FaultProxy(server.url, lambda *_: PASS) as injector:
        _sdk_to(monkeypatch, injector.url, server.url)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(Sandbox.create, idempotency_key=key, metadata={"n": "1"})
            assert wait_for(lambda: injector.of(*CREATES), 30, interval=0.02)
            retry = pool.submit(Sandbox.create, idempotency_key=key, metadata={"n": "1"})
            ids = {first.result().sandbox_id, retry.result().sandbox_id}
        # The same key for another request: refused, whatever the first did.
        with pytest.raises(SandboxException, match="another request"):
            Sandbox.create(idempotency_key=key, metadata={"n": "2"})
    ran, waited, refused = injector.of(*CREATES)
    assert waited.sent_at < ran.answered_at, "the retry was sent after the first had answered"
    assert waited.answer_headers["idempotent-replayed"] == "true"
    assert refused.status == 409
    assert len(ids) == 1 and server.sandbox_ids() - before == ids


def test_a_node_answer_lost_on_its_way_to_the_control_plane(
    kit_ready: None, tmp_path: Path, vms: VmFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client gave no key: the control plane relays under one of its own, so asking
    the node again (its connection dropped after the node created) finds the first."""
    state = f"sqlite:///{tmp_path / 'state.db'}"
    node = vms.own(LiveServer(tmp_path / "node"))
    control = vms.own(LiveServer(tmp_path / "control"))
    with FaultProxy(node.url, first_create(DROP)) as injector:
        node.extra_env.update(
            AENV_SERVER_ROLE="node",
            AENV_SERVER_NODE_NAME="n1",
            AENV_SERVER_ADVERTISE_URL=injector.url,
            AENV_STATE_URL=state,
        )
        control.extra_env.update(AENV_SERVER_ROLE="control", AENV_STATE_URL=state)
        for member in (node, control):
            member.home.mkdir()
            member.start()
        assert wait_for(lambda: httpx.get(control.url + "/health").json()["nodes"] == 1, 60)
        _sdk_to(monkeypatch, control.url, control.url)
        sandbox = Sandbox.create()
        dropped, asked_again = injector.of(*CREATES)
        assert (dropped.fault, asked_again.fault) == (DROP, PASS)
        assert dropped.headers["Idempotency-Key"] == asked_again.headers["Idempotency-Key"]
        assert sandbox.sandbox_id == _created(dropped.body)
        assert node.sandbox_ids() == control.sandbox_ids() == {sandbox.sandbox_id}
        # A client's key is the control plane's to answer too: its retry never reaches a node.
        with control.client() as api:
            body, keyed = {"templateID": "base"}, {"Idempotency-Key": _key("control")}
            created = api.post("/v2/sandboxes", json=body, headers=keyed)
            again = api.post("/v2/sandboxes", json=body, headers=keyed)
        assert created.status_code == again.status_code == 201
        assert again.json() == created.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert len(injector.of(*CREATES)) == 3
        assert len(node.sandbox_ids()) == 2


def test_a_key_whose_server_was_killed_runs_again_after_its_lease(
    fresh_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILLed mid-create, the server left the key held: the retry after the restart
    waits out the dead run's lease and creates; recovery removed the half-made one."""
    fresh_server.extra_env["AENV_CRASH_AT"] = "create.vm"
    fresh_server.start()
    _sdk_to(monkeypatch, fresh_server.url, fresh_server.url)
    key = _key("crashed")
    with pytest.raises(Exception):  # noqa: B017 - the connection breaks, however the SDK says it
        Sandbox.create(idempotency_key=key)
    assert fresh_server.proc is not None and fresh_server.proc.wait(timeout=60) != 0
    fresh_server.proc = None
    del fresh_server.extra_env["AENV_CRASH_AT"]
    fresh_server.start()
    sandbox = Sandbox.create(idempotency_key=key)
    assert fresh_server.sandbox_ids() == {sandbox.sandbox_id}


@pytest.mark.parametrize(
    ("refusal", "attempts", "advice"),
    [
        # No room for now (after a wait in line): 429 with Retry-After, and the SDK tries
        # three times more.
        (
            {"AENV_SANDBOX_MEMORY_OVERCOMMIT": "0.0001", "AENV_SANDBOX_ADMISSION_WAIT": "0.2"},
            4,
            "true",
        ),
        # More vCPUs than the host allows: no retry can help, the SDK stops at once.
        ({"AENV_SANDBOX_VCPUS": "2", "AENV_SANDBOX_MAX_VCPUS": "1"}, 1, "false"),
    ],
    ids=["no-capacity", "permanent"],
)
def test_a_refusal_says_whether_the_sdk_should_retry(
    fresh_server: LiveServer,
    monkeypatch: pytest.MonkeyPatch,
    refusal: dict[str, str],
    attempts: int,
    advice: str,
) -> None:
    fresh_server.extra_env.update(AENV_SANDBOX_BOOT_SNAPSHOTS="false", **refusal)
    fresh_server.start()
    with FaultProxy(fresh_server.url, lambda *_: PASS) as injector:
        _sdk_to(monkeypatch, injector.url, fresh_server.url)
        with pytest.raises(Exception, match=r"not enough host memory|vCPUs"):
            Sandbox.create(idempotency_key=_key("refused"))
    creates = injector.of(*CREATES)
    assert len(creates) == attempts
    for create in creates:
        assert create.status == (429 if advice == "true" else 503)
        assert create.answer_headers["should-retry"] == advice
        assert ("retry-after" in create.answer_headers) == (advice == "true")
        # A refusal is not kept under its key: each retry was tried anew.
        assert "idempotent-replayed" not in create.answer_headers
    assert fresh_server.sandbox_ids() == set()
