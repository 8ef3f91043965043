"""A Dockerfile written as E2B's own template definitions are, built by `aenv build -f` on
a Debian image without `user` or sudo: ENV in step order with `${VAR}` and ARG, the image's
own `useradd -m user`, sudo installed in a later step still giving `user` password-less
sudo, `systemctl start` of a unit in the start command, and a disk grown for the build."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from agentenv.config import load_config
from agentenv.guest.debootstrap import cache_dir
from agentenv.images.base import build_base_template
from agentenv.images.convert import loop_mount

from ..images.oci_build import LayerBuilder, build_image, build_layer, push_image
from ..images.registry_server import running_registry
from ..live import AENV, TEST_KEY, LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.usefixtures("e2b_env")]

# The base disk is 4096 MiB; this asks for more free space than that.
FREE_MB = 6144

DOCKERFILE = """\
FROM {image}
ARG JAVA_VERSION=11
ENV JAVA_HOME=/usr/lib/jvm/jdk-${{JAVA_VERSION}} TOOLS=/opt/tools
ENV TOOLS_BIN=$TOOLS/bin JAVA_VERSION=17
RUN test ! -e /usr/bin/sudo && ! id user && test "$(id -un):$(pwd)" = root:/
RUN fallocate -l 5G /var/big && rm /var/big
RUN useradd -m -s /bin/bash user
USER user
RUN whoami > /home/user/first
USER root
COPY sudo.deb /tmp/sudo.deb
RUN dpkg -i /tmp/sudo.deb && rm /tmp/sudo.deb
COPY hello.service /etc/systemd/system/hello.service
RUN mkdir -p $TOOLS_BIN
USER user
RUN sudo -n true && sudo -n id -un > /home/user/sudo-as
WORKDIR /home/user
CMD sudo systemctl start hello
"""

UNIT = """\
[Unit]
Description=a service started by systemctl, as E2B's templates start theirs

[Service]
Type=simple
WorkingDirectory=/srv/hello
Environment=GREETING=hi
ExecStartPre=/bin/mkdir -p /srv/hello
ExecStartPre=/bin/sh -c 'echo "$GREETING from $(whoami)" > /srv/hello/index.html'
ExecStart=/usr/bin/python3 -m http.server 8081
"""


def _without_user(text: str) -> bytes:
    """/etc/passwd, group and their shadows without `user`, as a plain Debian image."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] == "user":
            continue
        if len(fields) == 4:  # group and gshadow: members last
            members = [m for m in fields[-1].split(",") if m and m != "user"]
            fields[-1] = ",".join(members)
        lines.append(":".join(fields))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def plain_debian(kit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian 12 (the base template's tree) without `user` and without sudo's binary or
    rules, in a local registry."""
    base = build_base_template(load_config(), progress=lambda _: None)
    with loop_mount(base.rootfs, tmp_path_factory.mktemp("base-mnt"), readonly=True) as root:
        debian = build_layer(LayerBuilder.from_dir(root, owner=None), "zstd")
        stripped = (
            LayerBuilder()
            .whiteout("usr/bin/sudo")
            .whiteout("home/user")
            .opaque("etc/sudoers.d")
            .file("etc/passwd", _without_user((root / "etc/passwd").read_text()))
            .file("etc/group", _without_user((root / "etc/group").read_text()))
            .file("etc/shadow", _without_user((root / "etc/shadow").read_text()), mode=0o640)
            .file("etc/gshadow", _without_user((root / "etc/gshadow").read_text()), mode=0o640)
        )
    layer = build_layer(stripped, "gzip")
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        push_image(registry.url, "demo/plain", "v1", build_image([debian, layer]))
        yield f"{registry.host}/demo/plain:v1"


@pytest.fixture
def context(tmp_path: Path, plain_debian: str) -> Path:
    debs = sorted(cache_dir(load_config()).glob("sudo_*.deb"))
    assert debs, "the kit's package cache has sudo (the base template installs it)"
    (tmp_path / "sudo.deb").write_bytes(debs[-1].read_bytes())
    (tmp_path / "hello.service").write_text(UNIT)
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.format(image=plain_debian))
    return tmp_path


def test_an_e2b_style_dockerfile_builds_and_runs_as_e2bs_would(
    server: LiveServer, context: Path
) -> None:
    env = {**os.environ, "AENV_API_URL": server.url, "AENV_API_KEY": TEST_KEY}
    built = subprocess.run(
        [AENV, "build", "-f", str(context / "Dockerfile"), "--name", "e2b-order",
         "--memory", "512", "--cpu", "1", "--min-free-disk", str(FREE_MB),
         "--ready-cmd", "curl -sf localhost:8081"],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    sandbox = Sandbox.create("e2b-order")
    try:
        out = sandbox.commands.run(
            "whoami; pwd; echo $JAVA_HOME $TOOLS_BIN $JAVA_VERSION; cat first sudo-as; "
            "sudo -n true && echo sudo-ok; sudo stat -c %a /etc/sudoers.d/user; "
            "curl -s localhost:8081; systemctl is-active hello; test -d /opt/tools/bin && "
            "echo tools; df -Pm / | awk 'NR == 2 {print $4}'"
        ).stdout.splitlines()
        assert out[:10] == [
            "user",
            "/home/user",
            # ARG is ENV for the build; a pair sees the ones before it, never later ones.
            "/usr/lib/jvm/jdk-11 /opt/tools/bin 17",
            "user",
            "root",
            "sudo-ok",
            "440",
            "hi from root",
            "active",
            "tools",
        ], out
        # The filesystem grew (best effort: metadata takes a little of what was asked).
        assert int(out[10]) >= FREE_MB * 0.95, out
        # The service stops as it started.
        sandbox.commands.run("sudo systemctl stop hello")
        stopped = sandbox.commands.run("systemctl is-active hello || true")
        assert stopped.stdout == "inactive\n"
    finally:
        sandbox.kill()
