"""Images without bash (busybox, an alpine-like one) and without any shell: commands from
the SDK and `aenv`, and template builds from steps, work in them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from e2b import Sandbox, Template

from ..images.oci_build import build_image, busybox_layer, push_image
from ..images.registry_server import running_registry
from ..live import AENV, TEST_KEY, LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@dataclass
class MinimalImages:
    busybox: str
    alpine: str
    no_shell: str


@pytest.fixture(scope="module")
def minimal(kit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinimalImages]:
    env = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        images = {
            "busybox": busybox_layer(True, {}),
            "alpine": busybox_layer(
                True,
                {"etc/os-release": b"ID=alpine\nNAME=Alpine-like\n", "etc/shells": b"/bin/sh\n"},
            ),
            "noshell": busybox_layer(False, {}),
        }
        for name, layer in images.items():
            push_image(registry.url, f"mini/{name}", "v1", build_image([layer], env=env))
        yield MinimalImages(
            *(f"{registry.host}/mini/{name}:v1" for name in ("busybox", "alpine", "noshell"))
        )


def _aenv(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AENV_API_URL": server.url, "AENV_API_KEY": TEST_KEY}
    return subprocess.run([AENV, *args], capture_output=True, text=True, env=env, timeout=600)


def _pulled(server: LiveServer, ref: str) -> str:
    """The template `aenv pull` makes of `ref` (a create never pulls)."""
    pulled = _aenv(server, "pull", ref)
    assert pulled.returncode == 0, pulled.stderr
    return pulled.stdout.strip()


@pytest.mark.parametrize("image", ["busybox", "alpine"])
def test_commands_run_in_an_image_without_bash(
    server: LiveServer, minimal: MinimalImages, image: str
) -> None:
    template = _pulled(server, getattr(minimal, image))
    started = _aenv(server, "start", template, "--detach", "--timeout", "300")
    assert started.returncode == 0, started.stderr
    sandbox_id = started.stdout.strip()
    try:
        # The SDK asks for /bin/bash; the image's /bin/sh runs it instead.
        sandbox = Sandbox.connect(sandbox_id)
        result = sandbox.commands.run("echo $0; id -un; echo $((6 * 7))")
        assert result.stdout.splitlines() == ["/bin/sh", "root", "42"]
        # `aenv exec`: one argument is a script, several run without a shell.
        script = _aenv(server, "exec", sandbox_id, "--", "echo script | tr a-z A-Z")
        assert script.returncode == 0 and script.stdout == "SCRIPT\n", script.stderr
        direct = _aenv(server, "exec", sandbox_id, "--", "ls", "/bin/busybox")
        assert direct.returncode == 0 and direct.stdout == "/bin/busybox\n", direct.stderr
    finally:
        _aenv(server, "rm", sandbox_id)


def test_an_image_without_any_shell_runs_commands_given_as_arguments(
    server: LiveServer, minimal: MinimalImages
) -> None:
    template = _pulled(server, minimal.no_shell)
    started = _aenv(server, "start", template, "--detach", "--timeout", "300")
    assert started.returncode == 0, started.stderr
    sandbox_id = started.stdout.strip()
    try:
        direct = _aenv(server, "exec", sandbox_id, "--", "/bin/busybox", "echo", "no shell")
        assert direct.returncode == 0 and direct.stdout == "no shell\n", direct.stderr
        script = _aenv(server, "exec", sandbox_id, "--", "echo needs a shell")
        assert script.returncode != 0 and "/bin/bash" in script.stderr
    finally:
        _aenv(server, "rm", sandbox_id)


def test_a_template_builds_on_busybox(server: LiveServer, minimal: MinimalImages) -> None:
    recipe = (
        Template()
        .from_image(minimal.busybox)
        .run_cmd("whoami > who; pwd >> who")
        .set_envs({"FLAVOUR": "busybox"})
        .run_cmd("echo $FLAVOUR > /tmp/flavour", user="root")
    )
    Template.build(recipe, "on-busybox", cpu_count=1, memory_mb=512)
    sandbox = Sandbox.create("on-busybox")
    try:
        # E2B's default user was made (busybox's adduser) and is the sandbox's default.
        out = sandbox.commands.run("cat who /tmp/flavour; id -un").stdout.splitlines()
        assert out == ["user", "/home/user", "busybox", "user"]
    finally:
        sandbox.kill()
