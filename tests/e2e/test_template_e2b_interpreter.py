"""E2B's code-interpreter template definition (`template/template.py` in
e2b-dev/code-interpreter), step for step through the SDK's `Template` builder, with its
kernels for Python and its two systemd units started by `sudo systemctl start jupyter`;
and a Dockerfile in the official node image's style.

Adapted only where it reaches the internet or ships E2B's own code:
- python:3.13 is the local Debian 12 stand-in (`plaindebian.py`);
- apt and pip read a mirror of the kit's packages in a namespace host (`packagemirror.py`),
  so requirements are what the mirror has, and nodesource's setup script is not run;
- the kernels fetched from GitHub, CRAN and java.net are left out, and so is what only
  costs minutes under TCG (build-essential, the data stack, pip's bytecode compiling);
- E2B's server is theirs to ship: ours (`aenv_interpreter`) is copied in its place, and
  Jupyter Server (not mirrored; ours needs none) is stood in for by a server of its
  `/api/status`, which E2B's unit pair waits on.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Template, wait_for_port, wait_for_url
from e2b.template.main import TemplateFinal
from e2b_code_interpreter import Sandbox

from agentenv.config import load_config
from agentenv.guest import interpreter

from ..live import LiveServer, point_sdk
from ..packagemirror import Mirror, package_mirror
from .plaindebian import plain_debian_image

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.usefixtures("e2b_env")]

NAME = "e2b-code-interpreter"
# E2B's list, less fonts-noto-cjk (not in the kit's packages) and build-essential (for
# building sdists; the mirror serves wheels), then Debian's nodejs.
APT_PACKAGES = ["curl", "git", "util-linux", "jq", "sudo", "ca-certificates"]
# E2B's requirements.txt, cut to the Python kernel's own: the data stack is
# code-interpreter-v1's, tested there; installing it here would cost minutes under TCG.
REQUIREMENTS = "ipykernel\nipython\n"
SERVER_REQUIREMENTS = "jupyter_client\naiohttp\n"

JUPYTER_UNIT = """\
[Unit]
Description=Jupyter Server (a stand-in answering /api/status)
Wants=code-interpreter.service
StartLimitBurst=0

[Service]
Type=simple
Environment=MATPLOTLIBRC=/root/.config/matplotlib/.matplotlibrc
ExecStart=/usr/bin/python3 -m http.server 8888 --directory /root/.jupyter/status
ExecStartPost=-/usr/bin/systemctl reset-failed code-interpreter
Restart=on-failure
RestartSec=1
StandardOutput=null
StandardError=journal
"""

INTERPRETER_UNIT = """\
[Unit]
Description=Code Interpreter Server
Requires=jupyter.service
After=jupyter.service
PartOf=jupyter.service
StartLimitBurst=0

[Service]
Type=simple
WorkingDirectory=/root/.server
ExecStartPre=/root/.jupyter/jupyter-healthcheck.sh
ExecStart=/root/.server/.venv/bin/python -m aenv_interpreter --serve
Restart=on-failure
RestartSec=1
StandardOutput=journal
StandardError=journal
"""

HEALTHCHECK = """\
#!/bin/bash
# Jupyter's /api/status, tried for 10 s as E2B's check does.
for i in $(seq 1 50); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' localhost:8888/api/status)" = 200 ]; then
        exit 0
    fi
    sleep 0.2
done
exit 1
"""

STARTUP_SCRIPT = "startup_marker = 'ran from the IPython profile'\n"
KERNEL_CONFIG = "c.IPKernelApp.exec_lines = [\"config_marker = 'from the kernel config'\"]\n"


def context_files(into: Path) -> Path:
    """The files E2B's template copies, under `into`."""
    into.mkdir(parents=True)
    (into / "requirements.txt").write_text(REQUIREMENTS)
    server = into / "server"
    shutil.copytree(
        Path(interpreter.__file__).parent,
        server / "aenv_interpreter",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (server / "requirements.txt").write_text(SERVER_REQUIREMENTS)
    (into / "matplotlibrc").write_text("figure.dpi: 72\n")
    (into / "jupyter-healthcheck.sh").write_text(HEALTHCHECK)
    (into / "ipython_kernel_config.py").write_text(KERNEL_CONFIG)
    (into / "startup_scripts").mkdir()
    (into / "startup_scripts" / "0001_marker.py").write_text(STARTUP_SCRIPT)
    (into / "systemd").mkdir()
    (into / "systemd" / "jupyter.service").write_text(JUPYTER_UNIT)
    (into / "systemd" / "code-interpreter.service").write_text(INTERPRETER_UNIT)
    return into


def e2b_template(image: str, mirror: Mirror, context: Path) -> TemplateFinal:
    """E2B's `make_template(kernels=["python"])`, adapted as the module says."""
    return (
        Template(file_context_path=str(context))
        .from_image(image)
        .set_user("root")
        .set_workdir("/root")
        .set_envs(
            {
                "PIP_DEFAULT_TIMEOUT": "100",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PIP_NO_CACHE_DIR": "1",
                "JAVA_VERSION": "11",
                "JAVA_HOME": "/usr/lib/jvm/jdk-${JAVA_VERSION}",
                "IJAVA_VERSION": "1.3.0",
                "R_VERSION": "4.5.*",
                **mirror.pip_env,
                # Bytecode is compiled on first import instead: under TCG, pip's compiling
                # at install time costs minutes.
                "PIP_NO_COMPILE": "1",
            }
        )
        .run_cmd(mirror.apt_setup)
        .apt_install(APT_PACKAGES)
        .apt_install("nodejs")
        .copy("requirements.txt", "requirements.txt")
        .pip_install("--no-cache-dir -r requirements.txt")
        .run_cmd("ipython kernel install --name 'python3' --user")
        .copy("server", ".server")
        .run_cmd("python -m venv .server/.venv")
        .run_cmd(".server/.venv/bin/pip install --no-cache-dir -r .server/requirements.txt")
        .copy("matplotlibrc", ".config/matplotlib/.matplotlibrc")
        .copy("jupyter-healthcheck.sh", ".jupyter/jupyter-healthcheck.sh")
        .run_cmd("chmod +x .jupyter/jupyter-healthcheck.sh")
        .run_cmd("mkdir -p .jupyter/status/api && echo '{}' > .jupyter/status/api/status")
        .make_dir(".ipython/profile_default/startup")
        .copy("ipython_kernel_config.py", ".ipython/profile_default/")
        .copy("startup_scripts", ".ipython/profile_default/startup")
        .copy("systemd/jupyter.service", "/etc/systemd/system/jupyter.service")
        .copy("systemd/code-interpreter.service", "/etc/systemd/system/code-interpreter.service")
        .set_user("user")
        .set_workdir("/home/user")
        .set_start_cmd(
            "sudo systemctl start jupyter", wait_for_url("http://localhost:49999/health")
        )
    )


@dataclass(frozen=True)
class Lab:
    """The Debian stand-in image, the package mirror and a directory, for the module."""

    image: str
    mirror: Mirror
    workdir: Path


@pytest.fixture(scope="module")
def lab(
    server: LiveServer, kit_ready: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    workdir = tmp_path_factory.mktemp("e2b-template")
    with plain_debian_image(workdir) as image, package_mirror(load_config(), workdir / "m") as m:
        yield Lab(image, m, workdir)


@pytest.fixture(scope="module")
def mirror(lab: Lab, server: LiveServer) -> Mirror:
    """The mirror E2B's template was built from, once for the module."""
    context = context_files(lab.workdir / "context")
    recipe = e2b_template(lab.image, lab.mirror, context)
    with pytest.MonkeyPatch.context() as env:  # before the tests' own `e2b_env`
        point_sdk(env, server.url)
        # Its log in the test's output, should it fail.
        Template.build(recipe, alias=NAME, cpu_count=2, memory_mb=1024, on_build_logs=print)
    return lab.mirror


def test_the_sdk_runs_code_in_e2bs_template(mirror: Mirror) -> None:
    sandbox = Sandbox.create(NAME)
    try:
        assert sandbox.run_code("x = 40 + 2; x").text == "42"
        assert sandbox.run_code("x + 1").text == "43"
        # IPython read E2B's profile: its startup scripts and kernel config.
        # (A string's quotes go, as E2B's service shows them.)
        assert sandbox.run_code("startup_marker").text == "ran from the IPython profile"
        assert sandbox.run_code("config_marker").text == "from the kernel config"
        env = sandbox.commands.run("whoami; pwd; echo $JAVA_HOME; sudo -n id -un; node -e 1")
        assert env.stdout.splitlines() == ["user", "/home/user", "/usr/lib/jvm/jdk-11", "root"]
        units = sandbox.commands.run("systemctl is-active jupyter code-interpreter")
        assert units.stdout.splitlines() == ["active", "active"]
        # apt and pip had no source but the mirror: nothing came from the internet.
        sources = sandbox.commands.run(
            "cat /etc/apt/sources.list; ls /etc/apt/sources.list.d | wc -l; echo $PIP_NO_INDEX"
        ).stdout.splitlines()
        assert sources == [mirror.apt_source, "0", "1"]
    finally:
        sandbox.kill()


def test_a_killed_service_is_restarted_and_stops_with_jupyter(mirror: Mirror) -> None:
    sandbox = Sandbox.create(NAME)
    try:
        assert sandbox.run_code("1 + 1").text == "2"
        sandbox.commands.run("sudo pkill -KILL -f 'aenv_interpreter [-]-serve'")
        # Restart=on-failure, RestartSec=1: back within seconds, with a fresh kernel.
        waited = sandbox.commands.run(
            "for i in $(seq 1 120); do curl -sf localhost:49999/health && exit 0; sleep 0.5;"
            " done; exit 1",
            timeout=120,
        )
        assert waited.exit_code == 0
        assert sandbox.run_code("2 + 2").text == "4"
        sandbox.commands.run("sudo systemctl stop jupyter")
        # PartOf=jupyter.service: the code interpreter stopped with it.
        stopped = sandbox.commands.run("systemctl is-active code-interpreter || true")
        assert stopped.stdout == "inactive\n"
    finally:
        sandbox.kill()


# Dockerfiles written as the official images' READMEs and Docker's guides show them,
# adapted only to reach the mirror instead of the internet (the first RUN, pip's ENV).
NODE_APP = """\
FROM {image}
ARG NODE_MAJOR=18
ENV APP_ROOT=/home/node/app NODE_LABEL=node-${{NODE_MAJOR}}
ENV APP_BIN=$APP_ROOT/bin NODE_MAJOR=20
RUN test ! -e /usr/bin/sudo && ! id user && test "$(id -un):$(pwd)" = root:/
RUN {apt_setup}
RUN groupadd --gid 1000 node \\
    && useradd --uid 1000 --gid node --shell /bin/bash --create-home node
RUN useradd -m -s /bin/bash user
RUN apt-get update && apt-get install -y --no-install-recommends nodejs \\
    && rm -rf /var/lib/apt/lists/*
RUN fallocate -l 5G /var/big && rm /var/big
WORKDIR $APP_ROOT
COPY --chown=node:node package.json server.js ./
USER node
ENV NODE_ENV=production
EXPOSE 3000
CMD ["node", "server.js"]
"""

# More free space than the base disk's 4096 MiB (E2B's minFreeDiskMb).
FREE_MB = 6144

SERVER_JS = """\
const http = require("http");
const user = require("os").userInfo().username;
http.createServer((req, res) => res.end(`node ${process.version} as ${user}`)).listen(3000);
"""


@contextmanager
def built_from_dockerfile(
    lab: Lab, name: str, text: str, files: dict[str, str], start: str, port: int
) -> Iterator[Sandbox]:
    """`text` (formatted for the lab) built as template `name` with `files` beside it, its
    CMD `start` ready once `port` listens; a sandbox of it for the block."""
    context = lab.workdir / name
    context.mkdir()
    for file, content in files.items():
        (context / file).write_text(content)
    dockerfile = text.format(image=lab.image, apt_setup=lab.mirror.apt_setup)
    (context / "Dockerfile").write_text(dockerfile)
    recipe = (
        Template(file_context_path=str(context))
        .from_dockerfile(str(context / "Dockerfile"))
        .set_start_cmd(start, wait_for_port(port))
    )
    Template.build(recipe, alias=name, cpu_count=1, memory_mb=512, min_free_disk_mb=FREE_MB)
    sandbox = Sandbox.create(name)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_a_node_apps_dockerfile_whose_user_has_uid_1000(lab: Lab) -> None:
    """As the official node image: `node` is uid 1000, the uid our `user` would take, and
    the image makes its own `user` too. With E2B's other Dockerfile constructs: ARG, ENV
    pairs in step order, and a disk grown for the build (`minFreeDiskMb`)."""
    files = {"package.json": '{"name": "app", "version": "1.0.0"}\n', "server.js": SERVER_JS}
    with built_from_dockerfile(lab, "node-app", NODE_APP, files, "node server.js", 3000) as box:
        out = box.commands.run("whoami; pwd; curl -s localhost:3000").stdout.splitlines()
        assert out[:2] == ["node", "/home/node/app"], out
        assert out[2].startswith("node v") and out[2].endswith(" as node"), out
        assert box.commands.run("stat -c %U server.js").stdout == "node\n"
        env = box.commands.run("echo $NODE_LABEL $APP_BIN $NODE_MAJOR; id -u user").stdout
        # A pair sees the ones before it, never later ones; ARG is ENV for the build.
        assert env.splitlines() == ["node-18 /home/node/app/bin 20", "1001"], env
        free = box.commands.run("df -Pm / | awk 'NR == 2 {print $4}'").stdout
        assert int(free) >= FREE_MB * 0.95, free
