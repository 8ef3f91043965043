"""Templates built from steps by the unmodified `e2b` SDK: files copied in, commands run as
a user, ENV/WORKDIR/USER kept for the template's sandboxes, a start command left running
behind its ready check, and a rebuild served from the step cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException, SandboxException

from ..live import AENV, TEST_KEY, LiveServer, point_sdk
from ..vmfactory import VmFactory

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture
def context(tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "test.txt").write_text("This is a test file.\n")
    (folder / "symlink.txt").symlink_to("test.txt")
    (tmp_path / "app.py").write_text("print('app')\n")
    return tmp_path


def _recipe(context: Path) -> Template:
    return (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("folder/*", "folder")
        .copy("app.py", "/opt/app/", mode=0o755)
        .run_cmd("cat folder/test.txt")
        .set_envs({"GREETING": "hello there"})
        .set_workdir("/srv/site")
        .run_cmd('echo "$GREETING" > index.html', user="root")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )


def test_a_template_from_steps_starts_its_sandboxes_ready(
    server: LiveServer, context: Path
) -> None:
    logs: list[str] = []
    with server.client() as api:
        # What other tests of this server left: the build must add nothing to it.
        snapshots_before = api.get("/snapshots").json()
    info = Template.build(
        _recipe(context),
        "stepped",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    assert any("RUN cat folder/test.txt" in line for line in logs), logs
    # E2B's logs route too: forward from a cursor, or back from the end.
    with server.client() as api:
        route = f"/templates/stepped/builds/{info.build_id}/logs"
        forward = api.get(route).json()["logs"]
        assert any("RUN cat folder/test.txt" in entry["message"] for entry in forward)
        last = api.get(route, params={"direction": "backward", "limit": 1}).json()["logs"]
        assert last == forward[-1:]
    assert "This is a test file." in logs
    # A template like any other: listed, found by alias; not a snapshot, nor its cache.
    assert Template.exists("stepped")
    with server.client() as api:
        listed = {t["templateID"]: t for t in api.get("/v2/templates").json()}
        assert listed["stepped"]["memoryMB"] == 512
        assert api.get("/snapshots").json() == snapshots_before

    sandbox = Sandbox.create("stepped")
    try:
        out = sandbox.commands.run(
            "pwd; echo $GREETING; cat /home/user/folder/test.txt; readlink /home/user/folder/"
            "symlink.txt; stat -c %a /opt/app/app.py; curl -s localhost:8000/index.html"
        ).stdout.splitlines()
        assert out == [
            "/srv/site",
            "hello there",
            "This is a test file.",
            "test.txt",
            "755",
            "hello there",
        ], out
    finally:
        sandbox.kill()

    # The same recipe again: every step comes from the cache.
    logs.clear()
    Template.build(
        _recipe(context),
        "stepped",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    cached = [line for line in logs if "CACHED" in line]
    assert len(cached) == 6, logs  # every step but FROM
    # Forced (`skip_cache`), the build runs every step again; each step keeps one entry
    # (other tests' builds on this server have entries of their own, which the cache's
    # bound may evict meanwhile: they were used less recently).
    snapshots = server.home / "snapshots"
    before = {entry.name for entry in snapshots.glob("buildcache-*")}
    Template.build(_recipe(context), "stepped", cpu_count=1, memory_mb=512, skip_cache=True)
    after = list(snapshots.glob("buildcache-*"))
    assert {entry.name for entry in after} <= before and len(after) >= 4  # COPY, COPY, RUN, RUN
    assert all(len(list(entry.iterdir())) == 1 for entry in after)
    sandbox = Sandbox.create("stepped")
    try:
        assert sandbox.commands.run("cat index.html").stdout == "hello there\n"
    finally:
        sandbox.kill()


def test_the_step_cache_keeps_within_its_bound(
    tmp_path: Path, vms: VmFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded to one byte, the cache keeps only the entry taken last, record and files:
    the same recipe again starts from it; a changed last step finds nothing before it."""
    node = vms.own(LiveServer(tmp_path / "home", extra_env={"AENV_CACHE_BUILD_MAX_BYTES": "1"}))
    node.home.mkdir()
    node.start()
    point_sdk(monkeypatch, node.url)
    logs: list[str] = []

    def build(last_step: str) -> None:
        logs.clear()
        recipe = Template().from_template("base").run_cmd("echo one > one").run_cmd(last_step)
        Template.build(
            recipe,
            "bounded",
            cpu_count=1,
            memory_mb=512,
            on_build_logs=lambda e: logs.append(e.message),
        )

    def entries() -> tuple[list[Path], list[Path]]:
        records = node.home / "objects" / "snapshots"
        return list((node.home / "snapshots").glob("buildcache-*/*")), list(
            records.glob("buildcache-*/*.json")
        )

    build("echo two > two")
    files, records = entries()
    assert len(files) == len(records) == 1, (files, records)
    build("echo two > two")
    assert sum("CACHED" in line for line in logs) == 2, logs
    build("echo three > three")
    assert not any("CACHED" in line for line in logs), logs
    files, records = entries()
    assert len(files) == len(records) == 1, (files, records)
    sandbox = Sandbox.create("bounded")
    try:
        assert sandbox.commands.run("cat one three").stdout == "one\nthree\n"
    finally:
        sandbox.kill()


def test_a_failing_step_fails_the_build_with_its_reason(server: LiveServer) -> None:
    failing = Template().from_template("base").run_cmd("exit 3")
    with pytest.raises(BuildException, match="failed to run command 'exit 3': exit status 3"):
        Template.build(failing, "failing", cpu_count=1, memory_mb=512)
    stranger = Template().from_template("base").run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as caught:
        Template.build(stranger, "stranger", cpu_count=1, memory_mb=512)
    assert (
        "failed to run command 'whoami': command failed: unauthenticated: invalid username: "
        "'root123'" in str(caught.value)
    )
    # No build sandbox is left behind.
    with server.client() as api:
        assert api.get("/v2/sandboxes").json() == []


def test_tags_name_builds(server: LiveServer) -> None:
    for version in ("1", "2"):
        recipe = Template().from_template("base").run_cmd(f"echo {version} > version")
        info = Template.build(recipe, f"tagged:v{version}", cpu_count=1, memory_mb=512)
        assert info.tags == [f"v{version}"]

    def version(ref: str) -> str:
        sandbox = Sandbox.create(ref)
        try:
            return sandbox.commands.run("cat version").stdout.strip()
        finally:
            sandbox.kill()

    assert (version("tagged:v1"), version("tagged:v2")) == ("1", "2")
    assigned = Template.assign_tags("tagged:v1", ["prod", "default"])
    assert assigned.build_id and sorted(assigned.tags) == ["default", "prod"]
    assert version("tagged:prod") == "1"
    assert version("tagged") == "1"  # `default` now names v1, though v2 is newer
    assert {t.tag for t in Template.get_tags("tagged")} == {"v1", "v2", "prod", "default"}
    Template.remove_tags("tagged", "prod")
    with pytest.raises(SandboxException, match="404"):
        Sandbox.create("tagged:prod")
    with pytest.raises(Exception, match="400"):
        Template.assign_tags("tagged:v1", ":invalid-tag")
    with pytest.raises(Exception, match="400"):
        Template.assign_tags("tagged:", "x")


DOCKERFILE = """\
FROM e2bdev/base
ARG PORT=8080
ENV SITE=/srv/www
ENV DATA=$HOME/data
COPY site/ $SITE/
RUN test -r $SITE/index.html
WORKDIR $SITE
CMD python3 -m http.server $PORT
"""


def test_aenv_builds_a_dockerfile_and_the_sdk_parses_one(
    server: LiveServer, tmp_path: Path
) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("from a Dockerfile\n")
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    env = {**os.environ, "AENV_API_URL": server.url, "AENV_API_KEY": TEST_KEY}
    built = subprocess.run(
        [AENV, "build", "-f", str(tmp_path / "Dockerfile"), "--name", "from-docker",
         "--memory", "512", "--cpu", "1", "--ready-cmd", "curl -sf localhost:8080"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert built.stdout == "from-docker\n"
    # Steps start as root in / (Docker's defaults) and end as E2B's `user`; the builder
    # expands $SITE in COPY and WORKDIR from ENV, in order, and RUN's shell has it.
    assert "[builder 2/10] USER root" in built.stderr, built.stderr
    assert "[builder 8/10] RUN test -r $SITE/index.html" in built.stderr, built.stderr
    assert "[builder 7/10] COPY site/ $SITE/" in built.stderr
    assert "[builder 10/10] USER user" in built.stderr
    sandbox = Sandbox.create("from-docker")
    try:
        assert sandbox.commands.run("curl -s localhost:8080").stdout == "from a Dockerfile\n"
        # An ENV value the builder's shell expanded (as root, as E2B does).
        assert sandbox.commands.run("echo $DATA").stdout == "/root/data\n"
    finally:
        sandbox.kill()

    # The SDK's own Dockerfile parser sends the same kind of steps.
    recipe = Template(file_context_path=str(tmp_path)).from_dockerfile(
        "FROM e2bdev/base\nCOPY site/index.html /srv/index.html\nRUN test -s /srv/index.html"
    )
    Template.build(recipe, "sdk-docker", cpu_count=1, memory_mb=512)
    sandbox = Sandbox.create("sdk-docker")
    try:
        assert sandbox.commands.run("cat /srv/index.html").stdout == "from a Dockerfile\n"
    finally:
        sandbox.kill()
