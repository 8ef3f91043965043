"""The unmodified `e2b` SDK's template builder against a live server: templates from images."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException
from e2b.template.types import TemplateBuildStatus

from ..images.oci_build import LayerBuilder, build_image, build_layer, push_image
from ..images.registry_server import running_registry
from ..live import LiveServer
from . import test_images
from .test_images import APP_DATA, Images, sha

# The module-scoped registry with test images, shared with test_images.py.
images = test_images.images

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry that wants a password, holding one small image."""
    with running_registry(tmp_path_factory.mktemp("private"), {"builder": "s3cret"}) as registry:
        layer = build_layer(LayerBuilder().file("hello.txt", b"hello\n"), "gzip")
        push_image(registry.url, "team/tiny", "v1", build_image([layer]), auth=registry.auth)
        yield f"{registry.host}/team/tiny:v1"


def _template_ids(server: LiveServer) -> set[str]:
    with server.client() as api:
        return {t["templateID"] for t in api.get("/v2/templates").json()}


def test_build_from_image_then_sandbox(server: LiveServer, images: Images) -> None:
    logs: list[str] = []
    info = Template.build(
        Template().from_image(images.app),
        alias="built-app",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    assert info.template_id == "built-app"
    assert any("template built-app ready" in line for line in logs), logs
    assert "built-app" in _template_ids(server)
    assert Template.exists("built-app")

    sandbox = Sandbox.create("built-app")
    try:
        result = sandbox.commands.run("whoami; echo $APP_MODE; sha256sum /srv/app/data.bin")
        lines = result.stdout.splitlines()
        assert lines[:2] == ["user", "test"]
        assert lines[2].split()[0] == sha(APP_DATA)
    finally:
        sandbox.kill()


def test_template_sizes_its_sandboxes(server: LiveServer, images: Images) -> None:
    Template.build(Template().from_image(images.app), alias="sized-app", cpu_count=2, memory_mb=320)
    with server.client() as api:
        template = api.get("/templates/sized-app").json()
    assert (template["cpuCount"], template["memoryMB"]) == (2, 320)
    sandbox = Sandbox.create("sized-app")
    try:
        info = sandbox.get_info()
        assert (info.cpu_count, info.memory_mb) == (2, 320)
        out = sandbox.commands.run("nproc; grep MemTotal /proc/meminfo").stdout.split()
        assert out[0] == "2"
        assert 250 * 1024 < int(out[2]) <= 320 * 1024  # kB the guest kernel can use
    finally:
        sandbox.kill()
    # A copy keeps its parent's size unless it asks for another.
    Template.build(Template().from_template("sized-app"), alias="sized-copy", memory_mb=384)
    with server.client() as api:
        copy = api.get("/templates/sized-copy").json()
    assert (copy["cpuCount"], copy["memoryMB"]) == (2, 384)


def test_build_in_background_from_template(server: LiveServer, images: Images) -> None:
    if "built-app" not in _template_ids(server):
        Template.build(Template().from_image(images.app), alias="built-app")
    info = Template.build_in_background(Template().from_template("built-app"), "built-copy")
    deadline = time.monotonic() + 60
    status = Template.get_build_status(info)
    while status.status == TemplateBuildStatus.BUILDING and time.monotonic() < deadline:
        time.sleep(0.2)
        status = Template.get_build_status(info)
    assert status.status == TemplateBuildStatus.READY, status
    assert "built-copy" in _template_ids(server)


def test_missing_image_is_a_build_error(images: Images) -> None:
    with pytest.raises(BuildException, match="404"):
        Template.build(
            Template().from_image(f"{images.registry.host}/demo/none:v1"), alias="built-none"
        )


def test_steps_run_on_a_pulled_image(server: LiveServer, images: Images, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("copied\n")
    recipe = (
        Template(file_context_path=tmp_path)
        .from_image(images.app)
        .copy("note.txt", "/srv/")
        .run_cmd("sha256sum /srv/app/data.bin > /srv/sum", user="root")
    )
    Template.build(recipe, "built-steps", cpu_count=1, memory_mb=512)
    sandbox = Sandbox.create("built-steps")
    try:
        out = sandbox.commands.run("cat /srv/note.txt /srv/sum", user="root").stdout.split()
        assert out[0] == "copied" and out[1] == sha(APP_DATA)
    finally:
        sandbox.kill()


def test_malformed_steps_are_refused_by_name(server: LiveServer, images: Images) -> None:
    with server.client() as api:
        answer = api.post("/v3/templates", json={"name": "built-bad", "cpuCount": 1})
        build = answer.json()["buildID"]
        start = api.post(
            f"/v2/templates/built-bad/builds/{build}",
            json={"fromImage": images.app, "steps": [{"type": "FROM", "args": ["x"]}]},
        )
        assert start.status_code == 400
        assert start.json()["message"].startswith("steps[0].type: 'FROM' is not one of")
        status = api.get(f"/templates/built-bad/builds/{build}/status").json()
        assert status["status"] == "error"


def test_more_vcpus_than_the_node_has_are_refused(server: LiveServer, images: Images) -> None:
    with pytest.raises(BuildException, match=r"cpuCount: at most \d+ vCPUs here, 16 asked"):
        Template.build(Template().from_image(images.app), alias="built-wide", cpu_count=16)
    assert "built-wide" not in _template_ids(server)


def test_registry_credentials(server: LiveServer, private: str) -> None:
    ref = private
    with pytest.raises(BuildException, match="authentication failed"):
        Template.build(
            Template().from_image(ref, username="builder", password="wrong"), alias="built-tiny"
        )
    Template.build(
        Template().from_image(ref, username="builder", password="s3cret"), alias="built-tiny"
    )
    assert "built-tiny" in _template_ids(server)
