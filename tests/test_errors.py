"""The error table: each kind of failure gets its status and E2B's body, whoever answers."""

from __future__ import annotations

import json

import pytest

from agentenv.errors import (
    RETRY_AFTER_SECONDS,
    AenvError,
    Conflict,
    DependencyFailed,
    ErrorAnswer,
    Forbidden,
    GuestUnresponsiveAtPause,
    InvalidInput,
    NotFound,
    PermanentlyUnavailable,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_answer,
)
from agentenv.images.convert import ConversionError
from agentenv.images.registry_errors import RegistryNotFound
from agentenv.net.plan import NetworkError
from agentenv.runtime.sandboxes.manager import GuestLost
from agentenv.storage.blockd import BlockdError
from agentenv.storage.chunkcache import CorruptChunk
from agentenv.storage.objectstore import ObjectStoreError
from agentenv.vmm.driver import VmmError
from agentenv.volumes.nfs import NfsError


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (InvalidInput("timeout must be positive"), 400, "timeout must be positive"),
        (Unauthorized("invalid API key"), 401, "invalid API key"),
        (Forbidden("not yours"), 403, "not yours"),
        (NotFound("sandbox 'i1' not found"), 404, "sandbox 'i1' not found"),
        (Conflict("sandbox 'i1' is paused"), 409, "sandbox 'i1' is paused"),
        (TooLarge("request body over 10 bytes"), 413, "request body over 10 bytes"),
        # Capacity, a silent guest and a volume server are the request's own trouble.
        (Unavailable("not enough memory"), 503, "not enough memory"),
        (NfsError("ganesha did not start"), 503, "ganesha did not start"),
        (
            RegistryNotFound(status=404, method="GET", url="https://r.io/v2/x/manifests/1"),
            404,
            "GET https://r.io/v2/x/manifests/1: 404 Not Found",
        ),
        # A host part that failed is named before its cause.
        (VmmError("qemu exited with 1"), 503, "the VMM failed: qemu exited with 1"),
        (ObjectStoreError("get a/b: EIO"), 503, "the object store failed: get a/b: EIO"),
        (CorruptChunk("chunk 00: bad hash"), 503, "the object store failed: chunk 00: bad hash"),
        (BlockdError("no answer", "unreachable"), 503, "the block daemon failed: no answer"),
        (
            NetworkError("ip netns add x: busy"),
            503,
            "the sandbox network failed: ip netns add x: busy",
        ),
        (VmmError(), 503, "the VMM failed: VmmError"),
        # Anything else is a bug.
        (KeyError("slot"), 500, "internal error: 'slot'"),
        (RuntimeError(), 500, "internal error: RuntimeError"),
    ],
)
def test_each_kind_of_failure_has_its_status(
    error: BaseException, status: int, message: str
) -> None:
    answer = error_answer(error)
    assert (answer.status, answer.message, answer.error_code) == (status, message, None)


def test_the_body_is_e2bs() -> None:
    answer = error_answer(NotFound("sandbox 'i1' not found"))
    assert answer.body() == {"code": 404, "message": "sandbox 'i1' not found"}
    assert json.loads(answer.encoded()) == answer.body()


def test_a_failure_with_an_e2b_error_code_carries_it() -> None:
    answer = error_answer(GuestUnresponsiveAtPause("sandbox 'i1' was paused while silent"))
    assert answer.body() == {
        "code": 409,
        "message": "sandbox 'i1' was paused while silent",
        "error_code": "sandbox_snapshot_guest_agent_unresponsive",
    }


def test_raw_asgi_answers_carry_the_same_body() -> None:
    start, body = ErrorAnswer(502, "The sandbox i1 was not found").asgi_messages(
        (b"connection", b"close")
    )
    assert start["type"] == "http.response.start" and start["status"] == 502
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    assert int(headers[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"code": 502, "message": "The sandbox i1 was not found"}


@pytest.mark.parametrize("family", [VmmError, ObjectStoreError, BlockdError, NetworkError])
def test_host_part_failures_keep_their_catches(family: type[DependencyFailed]) -> None:
    """Still RuntimeErrors, as before; never AenvErrors, which the pressure loop, wake on
    traffic and builds catch and handle as the request's own failure."""
    assert issubclass(family, RuntimeError)
    assert not issubclass(family, AenvError)


RETRY = {"Retry-After": str(RETRY_AFTER_SECONDS), "Should-Retry": "true"}
STOP = {"Should-Retry": "false"}


@pytest.mark.parametrize(
    ("error", "headers"),
    [
        # The client's own faults: the SDKs never retry a 4xx, so nothing is said.
        (InvalidInput("bad"), {}),
        (NotFound("gone"), {}),
        (Conflict("paused"), {}),
        # No capacity, or a part down for now: wait a moment and try again.
        (Unavailable("not enough host memory"), RETRY),
        (NfsError("ganesha did not start"), RETRY),
        (VmmError("qemu exited with 1"), RETRY),
        (ObjectStoreError("get a/b: EIO"), RETRY),
        # What no retry changes: stop at once.
        (PermanentlyUnavailable("the guest kit is not built"), STOP),
        (GuestLost("failed after its guest resumed"), STOP),
        (ConversionError("layer sha256:aa: mkfs failed"), STOP),
        (KeyError("slot"), STOP),
    ],
)
def test_each_failure_says_whether_a_retry_can_help(
    error: BaseException, headers: dict[str, str]
) -> None:
    assert error_answer(error).headers() == headers


def test_raw_asgi_answers_carry_the_retry_advice() -> None:
    start, _ = error_answer(Unavailable("no room")).asgi_messages()
    headers = dict(start["headers"])
    assert (headers[b"retry-after"], headers[b"should-retry"]) == (
        str(RETRY_AFTER_SECONDS).encode(),
        b"true",
    )
    start, _ = error_answer(RuntimeError("bug")).asgi_messages()
    assert dict(start["headers"])[b"should-retry"] == b"false"
