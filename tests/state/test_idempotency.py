"""Idempotency keys on both databases: claims, answers, leases, expiry and `run_once`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentenv.errors import InvalidInput
from agentenv.state.idempotency import (
    LEASE_SECONDS,
    TTL_SECONDS,
    Answer,
    Held,
    KeyReused,
    SqlKeyStore,
    check_key,
    run_once,
)
from agentenv.state.sandboxes import open_engine

CREATED = Answer(201, b'{"sandboxID": "i1"}')


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def keys(state_url: str, clock: Clock) -> AsyncIterator[SqlKeyStore]:
    engine = await open_engine(state_url)
    yield SqlKeyStore(engine, clock=clock)
    await engine.dispose()


async def test_a_key_answers_its_first_request_again(
    keys: SqlKeyStore, state_url: str, clock: Clock
) -> None:
    assert await keys.claim("node/k", "key-1", "req-a", "run-1") is None
    # While it runs, a retry sees it held without an answer; another request, refused.
    assert await keys.claim("node/k", "key-1", "req-a", "run-2") == Held("req-a", None)
    assert await keys.claim("node/k", "key-1", "req-b", "run-2") == Held("req-a", None)
    assert await keys.renew("node/k", "key-1", "run-1")
    assert not await keys.renew("node/k", "key-1", "run-2")
    assert await keys.finish("node/k", "key-1", "run-1", CREATED)
    assert await keys.claim("node/k", "key-1", "req-a", "run-3") == Held("req-a", CREATED)
    # Another scope (an API key, or the control plane's own) is another key.
    assert await keys.claim("control/k", "key-1", "req-b", "run-4") is None
    # The answer outlives the process: a store opened again still has it.
    engine = await open_engine(state_url)
    try:
        again = SqlKeyStore(engine, clock=clock)
        assert await again.claim("node/k", "key-1", "req-a", "run-5") == Held("req-a", CREATED)
    finally:
        await engine.dispose()


async def test_a_released_key_runs_again(keys: SqlKeyStore) -> None:
    assert await keys.claim("node/k", "key-1", "req-a", "run-1") is None
    await keys.release("node/k", "key-1", "run-1")
    assert await keys.claim("node/k", "key-1", "req-a", "run-2") is None


async def test_a_lapsed_lease_is_taken_over_by_one_retry(keys: SqlKeyStore, clock: Clock) -> None:
    """Its run died (SIGKILL): once the lease lapses, one retry runs the operation again."""
    assert await keys.claim("node/k", "key-1", "req-a", "dead") is None
    clock.now += LEASE_SECONDS / 2
    assert await keys.claim("node/k", "key-1", "req-a", "early") == Held("req-a", None)
    clock.now += LEASE_SECONDS
    assert await keys.claim("node/k", "key-1", "req-a", "retry-1") is None
    assert await keys.claim("node/k", "key-1", "req-a", "retry-2") == Held("req-a", None)
    # The old run, should it wake up, cannot answer for the key any more.
    assert not await keys.finish("node/k", "key-1", "dead", Answer(201, b"other"))
    assert await keys.finish("node/k", "key-1", "retry-1", CREATED)
    assert await keys.claim("node/k", "key-1", "req-a", "retry-2") == Held("req-a", CREATED)


async def test_keys_expire_after_a_day_and_are_pruned(keys: SqlKeyStore, clock: Clock) -> None:
    assert await keys.claim("node/k", "old", "req-a", "run-1") is None
    assert await keys.finish("node/k", "old", "run-1", CREATED)
    assert await keys.claim("node/k", "running", "req-a", "run-2") is None
    clock.now += TTL_SECONDS - 1
    assert await keys.prune() == 0
    assert await keys.renew("node/k", "running", "run-2")
    clock.now += 2
    # An expired key is free again, for any request.
    assert await keys.claim("node/k", "old", "req-b", "run-3") is None
    await keys.release("node/k", "old", "run-3")
    # A run still holding its key keeps it; the rest goes.
    assert await keys.claim("node/k", "done", "req-a", "run-4") is None
    assert await keys.finish("node/k", "done", "run-4", CREATED)
    clock.now += TTL_SECONDS + 1
    assert await keys.renew("node/k", "running", "run-2")
    assert await keys.prune() == 1
    assert await keys.claim("node/k", "running", "req-a", "run-5") == Held("req-a", None)


def test_a_key_has_e2bs_shape() -> None:
    assert check_key("a-1") == "a-1" and check_key("x" * 255)
    for bad in ("", "A", "a_b", "a b", "x" * 256, "ключ"):
        with pytest.raises(InvalidInput):
            check_key(bad)


async def test_run_once_runs_one_of_concurrent_retries(keys: SqlKeyStore) -> None:
    release = asyncio.Event()
    runs = 0

    async def create() -> Answer:
        nonlocal runs
        runs += 1
        await release.wait()
        return CREATED

    first = asyncio.create_task(run_once(keys, "node/k", "key-1", "req", create))
    await asyncio.sleep(0.1)
    retry = asyncio.create_task(run_once(keys, "node/k", "key-1", "req", create))
    await asyncio.sleep(0.3)
    assert not retry.done()  # it waits for the first
    release.set()
    assert await first == (CREATED, False)
    assert await retry == (CREATED, True)
    assert runs == 1
    with pytest.raises(KeyReused, match="key-1"):
        await run_once(keys, "node/k", "key-1", "another body", create)


async def test_run_once_keeps_no_answer_a_retry_may_change(keys: SqlKeyStore) -> None:
    answers = [Answer(503, b"no room"), Answer(400, b"bad"), CREATED]

    async def create() -> Answer:
        return answers.pop(0)

    assert await run_once(keys, "node/k", "key-1", "req", create) == (
        Answer(503, b"no room"),
        False,
    )
    # The 503 was not kept: the retry runs; the client's own fault (400) is kept.
    assert await run_once(keys, "node/k", "key-1", "req", create) == (Answer(400, b"bad"), False)
    assert await run_once(keys, "node/k", "key-1", "req", create) == (Answer(400, b"bad"), True)


async def test_a_failed_or_cancelled_run_gives_its_key_up(keys: SqlKeyStore) -> None:
    async def broken() -> Answer:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await run_once(keys, "node/k", "key-1", "req", broken)
    started = asyncio.Event()

    async def slow() -> Answer:
        started.set()
        await asyncio.sleep(60)
        return CREATED

    task = asyncio.create_task(run_once(keys, "node/k", "key-1", "req", slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await keys.claim("node/k", "key-1", "req", "next") is None
