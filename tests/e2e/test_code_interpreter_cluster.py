"""`code-interpreter-v1` on a local cluster: one node builds it, a create meanwhile is a
503 with Retry-After, and the unmodified `e2b_code_interpreter` SDK runs code through the
control URL, from Python and from Node."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from e2b_code_interpreter import Sandbox

from agentenv.cluster.local import BUCKET, S3_KEYS, ClusterState, LocalCluster

from ..live import point_sdk
from .conftest import TEMPLATE_BUILD_TIMEOUT
from .test_e2b_js_sdk import CODE_INTERPRETER_RESULTS, run_scenario_at

pytestmark = [pytest.mark.vm, pytest.mark.slow]

CLAIM = "builtin/code-interpreter-v1.json"


@pytest.fixture(scope="module")
def cluster(kit_ready: None) -> Iterator[ClusterState]:
    from agentenv.config import load_config
    from agentenv.images.codeinterpreter import build_code_interpreter

    build_code_interpreter(load_config())
    directory = Path(tempfile.mkdtemp(prefix="aenv-ci-cluster-", dir="/tmp"))
    local = LocalCluster(directory, env={"AENV_SANDBOX_MEMORY_MB": "256"})
    state = local.up(2)
    try:
        with pytest.MonkeyPatch.context() as environment:
            point_sdk(environment, state.control.url, state.api_key)
            yield state
    finally:
        local.down()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def _claim(state: ClusterState) -> dict | None:
    s3 = boto3.client(
        "s3",
        endpoint_url=state.s3_endpoint,
        aws_access_key_id=S3_KEYS["access_key"],
        aws_secret_access_key=S3_KEYS["secret_key"],
        region_name="us-east-1",
    )
    try:
        return json.loads(s3.get_object(Bucket=BUCKET, Key=CLAIM)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


def _node_logs(state: ClusterState) -> dict[str, str]:
    return {
        m.name: Path(m.log).read_text(errors="replace") for m in state.members if m.role == "node"
    }


def test_one_node_builds_it_and_the_sdk_runs_code_through_the_control_url(
    cluster: ClusterState,
) -> None:
    api = httpx.Client(
        base_url=cluster.control.url, headers={"X-API-Key": cluster.api_key}, timeout=120
    )
    first = api.post("/sandboxes", json={"templateID": "code-interpreter-v1", "timeout": 60})
    if first.status_code == 503:  # still building after the node's 30 s wait
        assert first.headers["Retry-After"] == "30"
        assert "is being built" in first.json()["message"]
    else:
        assert first.status_code == 201, first.text
        api.delete(f"/sandboxes/{first.json()['sandboxID']}")
    deadline = time.monotonic() + TEMPLATE_BUILD_TIMEOUT
    while (claim := _claim(cluster)) is None or claim["state"] == "building":
        assert time.monotonic() < deadline, "code-interpreter-v1 was not built in time"
        time.sleep(2)
    assert claim["state"] == "ready", claim
    builders = [
        name for name, log in _node_logs(cluster).items() if "building code-interpreter-v1" in log
    ]
    assert builders == [claim["node"]]
    # Sandboxes of it, each with its own running kernel.
    sandboxes = [Sandbox.create(timeout=120) for _ in range(2)]
    try:
        for number, sandbox in enumerate(sandboxes):
            sandbox.run_code(f"x = {number}")
        assert [s.run_code("x + 42").text for s in sandboxes] == ["42", "43"]
    finally:
        for sandbox in sandboxes:
            sandbox.kill()


def test_the_js_code_interpreter_sdk_through_the_control_url(
    cluster: ClusterState, node_sdk: str
) -> None:
    """`@e2b/code-interpreter`, unmodified, through the control plane (after the build)."""
    results = run_scenario_at(
        node_sdk,
        cluster.control.url,
        cluster.api_key,
        "codeInterpreter",
        lambda: "\n".join(_node_logs(cluster).values())[-4000:],
    )
    assert results == CODE_INTERPRETER_RESULTS
