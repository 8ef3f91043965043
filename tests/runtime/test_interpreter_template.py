"""The node's built-in `code-interpreter-v1`: stored image, build from steps with the
execution service copied in and started, a claim so one node builds it, and what a create
meets before it is there. Against a fake build host and a real object store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest

from agentenv.config import Config
from agentenv.errors import NotFound, TemplateBeingBuilt, error_answer
from agentenv.images.builder import TemplateBuilds
from agentenv.images.buildfiles import BuildFiles
from agentenv.images.catalog import TemplateCatalog
from agentenv.images.codeinterpreter import code_interpreter_version
from agentenv.images.stepbuild import copy_script
from agentenv.images.templates import TemplateRegistry
from agentenv.runtime.node import interpreter
from agentenv.runtime.node.interpreter import (
    CLAIM_KEY,
    READY_CMD,
    ROOTFS_TEMPLATE,
    SERVICE_DIR,
    START_CMD,
    TEMPLATE,
    Claim,
    CodeInterpreterTemplate,
    service_archive,
)
from agentenv.storage.filelayer import load_chain, materialize
from agentenv.storage.posix import PosixObjectStore

from ..images.test_stepbuild import FakeHost


class BuildHost(FakeHost):
    async def tag(self, snapshot_id: str, tags: list[str]) -> None:
        self.calls.append(("tag", snapshot_id, tags))


IMAGE = b"code interpreter rootfs".ljust(3 * 65536, b"\7")


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpreter, "POLL", 0.01)


@pytest.fixture
def service(tmp_path: Path) -> Path:
    src = tmp_path / "service"
    (src / "kernels").mkdir(parents=True)
    (src / "__main__.py").write_text("print('serving')\n")
    (src / "kernels" / "__init__.py").write_text("")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return src


def _node(
    tmp_path: Path, name: str, service: Path, *, image: bool = True
) -> tuple[CodeInterpreterTemplate, BuildHost]:
    """A node sharing `tmp_path/objects`, with the image built (or not)."""
    cfg = Config()
    cfg.paths.home = str(tmp_path / name)
    cfg.home.mkdir(parents=True)
    if image:
        directory = cfg.images_dir / "code-interpreter"
        directory.mkdir(parents=True)
        (directory / "rootfs.ext4").write_bytes(IMAGE)
        manifest = {"version": code_interpreter_version(cfg)}
        (directory / "manifest.json").write_text(json.dumps(manifest))
    store = PosixObjectStore(tmp_path / "objects")
    catalog = TemplateCatalog(cfg, TemplateRegistry(store), blockd=None)  # type: ignore[arg-type]
    builds = TemplateBuilds(cfg, catalog, None, 4, BuildFiles(store))  # type: ignore[arg-type]
    host = BuildHost()
    builds.host = host  # type: ignore[assignment]

    def lookup(ref: str) -> object | None:
        built = [s for s in host.snapshots if s[0] == ref and s[2]]
        return built[-1] if built else None

    return CodeInterpreterTemplate(builds, name, lookup, service), host


def test_the_node_stores_the_image_and_builds_the_template_started(
    tmp_path: Path, service: Path
) -> None:
    node, host = _node(tmp_path, "node-1", service)
    asyncio.run(node.ensure())
    assert node.missing is None
    # The image is a template of block layers holding it, byte for byte.
    record = node.templates.get(ROOTFS_TEMPLATE)
    out = tmp_path / "read-back"
    materialize(load_chain(node.store, record.layers[-1]), node.store, out)
    assert out.read_bytes() == IMAGE
    # Built from it at 2 vCPUs, 1 GiB: the service copied in, started, waited for.
    assert host.calls[0] == ("create", ROOTFS_TEMPLATE)
    writes = [c for c in host.calls if c[0] == "write"]
    assert len(writes) == 1 and writes[0][2] == service_archive(service)
    assert ("start", START_CMD, "user", "/home/user") in host.calls
    assert any(c[0] == "run" and c[1] == READY_CMD for c in host.calls)
    assert host.snapshots[-1][0] == TEMPLATE and host.snapshots[-1][2]  # with its memory
    [build] = node.builds.tracker.of_template(TEMPLATE)
    assert (build.status, build.vcpus, build.memory_mb) == ("ready", 2, 1024)
    claim = node.read_claim()
    assert claim is not None and (claim.state, claim.node) == ("ready", "node-1")
    # Current now: a restart builds nothing.
    creates = len([c for c in host.calls if c[0] == "create"])
    asyncio.run(node.ensure())
    assert len([c for c in host.calls if c[0] == "create"]) == creates


def test_the_service_archive_names_its_content_and_unpacks_as_the_package(
    tmp_path: Path, service: Path
) -> None:
    first = service_archive(service)
    (service / "__main__.py").touch()  # a new time, same content
    assert service_archive(service) == first
    archive = tmp_path / "service.tar"
    archive.write_bytes(first)
    root = tmp_path / "guest"
    script = copy_script(
        str(archive), "aenv_interpreter", f"{root}{SERVICE_DIR}", "root:root", "",
        spool=str(tmp_path / "spool"),
    )  # fmt: skip
    subprocess.run(["bash", "-c", script], check=True)
    package = root / SERVICE_DIR.lstrip("/")
    assert (package / "__main__.py").read_text() == "print('serving')\n"
    assert (package / "kernels" / "__init__.py").exists()
    assert not (package / "__pycache__").exists()
    # Changed content is a new archive, so the template is built again.
    (service / "__main__.py").write_text("print('v2')\n")
    assert service_archive(service) != first


def test_another_nodes_build_is_waited_for_and_a_create_meanwhile_gets_a_503(
    tmp_path: Path, service: Path
) -> None:
    builder, _ = _node(tmp_path, "node-1", service)
    other, other_host = _node(tmp_path, "node-2", service)
    image = interpreter.load_code_interpreter(builder.cfg)
    assert image is not None
    key = builder.key(image, service_archive(service))
    builder._write_claim(Claim(key, "node-1", "building", time.time()))

    async def scenario() -> None:
        waiting = asyncio.create_task(other.ensure())
        with pytest.raises(TemplateBeingBuilt) as caught:
            await other.await_ready(wait=0.05)
        answer = error_answer(caught.value)
        assert answer.status == 503 and answer.headers()["Retry-After"] == "30"
        assert "is being built" in answer.message
        assert answer.body()["error_code"] == "template_being_built"
        assert not waiting.done()  # it waits for node-1's build, not builds its own
        builder._write_claim(Claim(key, "node-1", "ready", time.time()))
        other_host.snapshots.append((TEMPLATE, None, True))  # node-1's, in the shared store
        await asyncio.wait_for(waiting, 5)
        await other.await_ready(wait=0)

    asyncio.run(scenario())
    assert not [c for c in other_host.calls if c[0] == "create"]


def test_a_build_whose_node_stopped_renewing_its_claim_is_taken_over(
    tmp_path: Path, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, host = _node(tmp_path, "node-2", service)
    image = interpreter.load_code_interpreter(node.cfg)
    assert image is not None
    stale = time.time() - interpreter.CLAIM_STALE - 1
    node._write_claim(Claim(node.key(image, service_archive(service)), "node-1", "building", stale))
    asyncio.run(node.ensure())
    claim = node.read_claim()
    assert claim is not None and (claim.state, claim.node) == ("ready", "node-2")
    assert host.snapshots[-1][0] == TEMPLATE


def test_a_failed_build_is_recorded_and_creates_are_told_why(
    tmp_path: Path, service: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, host = _node(tmp_path, "node-1", service)
    host.exits[READY_CMD] = 7  # the service never answers its health check
    monkeypatch.setattr(interpreter, "READY_TIMEOUT", 0.0)
    asyncio.run(node.ensure())
    claim = node.read_claim()
    assert claim is not None and claim.state == "failed" and "ready command" in claim.reason
    with pytest.raises(NotFound, match="failed to build: ready command"):
        asyncio.run(node.await_ready(wait=0))
    # The node's next start tries again.
    host.exits.pop(READY_CMD)
    asyncio.run(node.ensure())
    claim = node.read_claim()
    assert claim is not None and claim.state == "ready" and node.missing is None


def test_without_the_image_a_create_is_told_how_to_build_it(tmp_path: Path, service: Path) -> None:
    node, host = _node(tmp_path, "node-1", service, image=False)
    asyncio.run(node.ensure())
    assert not host.calls
    assert node.store.exists(CLAIM_KEY) is False
    with pytest.raises(NotFound, match="aenv kit build"):
        asyncio.run(node.await_ready(wait=0))
