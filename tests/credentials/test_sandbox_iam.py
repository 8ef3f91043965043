"""A sandbox's `iam` option: checked on create, kept in its record, inherited by forks,
and shown to nobody."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agentenv.api.models import NewSandbox
from agentenv.state.sandboxes import SandboxOptions

from ..api.test_error_answers import CreatingNode, api, client
from ..runtime.fakes import Harness, make_harness
from .test_identity import AWS, sandbox


class SandboxesNode(CreatingNode):
    """What the create and get routes use of a node."""

    def __init__(self, h: Harness) -> None:
        super().__init__(h)
        self.manager = h.manager


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        ({"aws": {"audience": "a", "tokenType": "X509-SVID"}}, "'X509-SVID' is not available"),
        ({"aws": {"audience": "", "tokenType": "JWT-SVID"}}, "audience"),
        ({"aws": {"audience": "a\nb", "tokenType": "JWT-SVID"}}, "audience"),
        ({"aws": {"audience": "a"}}, "tokenType"),
        ({"aws": {**AWS, "token_type": "JWT-SVID"}}, "token_type"),
        ({"": AWS}, "token names"),
        ({"a}b": AWS}, "token names"),
        ({"a{b": AWS}, "token names"),
        ({"a\x7fb": AWS}, "token names"),
        ({f"t{i}": AWS for i in range(65)}, "64"),
    ],
)
def test_bad_iam_options_are_refused(tokens: dict[str, Any], text: str) -> None:
    with pytest.raises(ValidationError, match=text):
        NewSandbox(templateID="base", iam={"tokens": tokens})


async def test_a_created_sandbox_keeps_its_tokens_and_shows_none(h: Harness) -> None:
    iam = {"tokens": {"aws": AWS, "Other Name": {**AWS, "audience": "https://x.example"}}}
    app = api(SandboxesNode(h))
    app.state.config = h.manager.cfg
    async with client(app) as c:
        created = await c.post("/sandboxes", json={"templateID": "base", "iam": iam})
        plain = await c.post("/sandboxes", json={"templateID": "base", "iam": {"tokens": {}}})
        sandbox_id = created.json()["sandboxID"]
        detail = await c.get(f"/sandboxes/{sandbox_id}")
        refused = await c.post(
            "/sandboxes",
            json={"templateID": "base", "iam": {"tokens": {"t": {**AWS, "tokenType": "OIDC"}}}},
        )
    assert created.status_code == plain.status_code == 201
    record = await h.manager.store.get(sandbox_id)
    assert record is not None and record.iam == iam
    assert (await h.manager.store.get(plain.json()["sandboxID"])).iam == {}  # type: ignore[union-attr]
    assert detail.status_code == 200
    assert "iam" not in detail.text and "sts.amazonaws.com" not in detail.text
    assert refused.status_code == 400
    assert "iam.tokens.t.tokenType" in refused.json()["message"]
    assert "'OIDC' is not available" in refused.json()["message"]


def test_a_fork_inherits_the_tokens() -> None:
    parent = sandbox("i1")
    assert SandboxOptions.of(parent).iam == parent.iam == {"tokens": {"aws": AWS}}
    assert SandboxOptions.of(parent).record_fields()["iam"] == parent.iam
