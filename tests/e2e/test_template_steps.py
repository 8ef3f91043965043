"""Templates built from steps by the unmodified `e2b` SDK: files copied in, commands run as
a user, ENV/WORKDIR/USER kept for the template's sandboxes, a start command left running
behind its ready check, and a rebuild served from the step cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException, SandboxException

from ..live import LiveServer

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
    Template.build(
        _recipe(context),
        "stepped",
        cpu_count=1,
        memory_mb=512,
        on_build_logs=lambda entry: logs.append(entry.message),
    )
    assert any("RUN cat folder/test.txt" in line for line in logs), logs
    assert "This is a test file." in logs
    # A template like any other: listed, found by alias; not a snapshot, nor its cache.
    assert Template.exists("stepped")
    with server.client() as api:
        listed = {t["templateID"]: t for t in api.get("/v2/templates").json()}
        assert listed["stepped"]["memoryMB"] == 512
        assert api.get("/snapshots").json() == []

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
    sandbox = Sandbox.create("stepped")
    try:
        assert sandbox.commands.run("cat index.html").stdout == "hello there\n"
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
