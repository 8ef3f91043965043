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

from ..live import AENV, TEST_KEY, LiveServer
from .plaindebian import plain_debian_image

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


@pytest.fixture(scope="module")
def plain_debian(kit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with plain_debian_image(tmp_path_factory.mktemp("plain-debian")) as image:
        yield image


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
