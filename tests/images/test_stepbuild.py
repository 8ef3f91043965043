"""Template builds from steps against a fake build host: order, users, directories, the
step cache, failures and readiness; and the COPY script run for real on an SDK archive."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2b.template.utils import tar_file_stream

from agentenv.errors import InvalidInput, NotFound
from agentenv.guest.rpc import ConnectError
from agentenv.images.builds import Build
from agentenv.images.buildsteps import StepState, parse_steps
from agentenv.images.stepbuild import Recipe, StepBuild, StepFailed, copy_script


@dataclass
class FakeHost:
    """Records what a build asks of its sandboxes; commands answer from `exits`."""

    exits: dict[str, int] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)
    cache: dict[str, tuple[str, StepState]] = field(default_factory=dict)
    snapshots: list[tuple[str, StepState, bool]] = field(default_factory=list)
    live: set[str] = field(default_factory=set)
    ready_after: int = 0
    # Cache entries deleted between a build's lookup and its create.
    evicted: set[str] = field(default_factory=set)

    async def identity(self, parent: str) -> str:
        return f"image:{parent}"

    async def create(self, parent: str, vcpus: int | None, memory_mb: int | None) -> str:
        if parent in self.evicted:
            raise NotFound(f"template '{parent}' not found")
        sandbox = f"sbx{len(self.calls)}"
        self.live.add(sandbox)
        self.calls.append(("create", parent))
        return sandbox

    async def run(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        user: str | None,
        cwd: str | None,
        env: dict[str, str],
        output: Callable[[str], None] | None,
    ) -> int:
        command = argv[-1]
        if command.startswith("exec 2>/dev/null"):
            # Values' expansion: the same shell script, run here over `env`.
            assert output is not None and user == "root"
            done = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True)
            for line in done.stdout.decode().split("\n")[:-1]:
                output(line)
            return done.returncode
        if command.startswith("set -e\nid -u "):
            name = command.splitlines()[1].split()[2]
            self.calls.append(("ensure-user", name))
            return 0
        if command.startswith("set -e\nmkdir -p /usr/local/bin"):
            self.calls.append(("systemctl",))
            return 0
        if "resize2fs" in command:
            self.calls.append(("grow", command))
            return 0
        if command == "pwd":
            assert output is not None
            output("/root" if user == "root" else f"/home/{user}")
            return 0
        if user == "nobody-here":
            raise ConnectError("unauthenticated", "invalid username: 'nobody-here'")
        self.calls.append(("run", command.splitlines()[0], user, cwd, dict(env)))
        if command == "ready":
            self.ready_after -= 1
            return 0 if self.ready_after < 0 else 1
        return self.exits.get(command, 0)

    async def start(
        self, sandbox_id: str, argv: list[str], *, user: str | None, cwd: str | None
    ) -> None:
        self.calls.append(("start", argv[-1], user, cwd))

    async def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        self.calls.append(("write", path, data))

    async def snapshot(self, sandbox_id: str, name: str, state: StepState, memory: bool) -> str:
        self.snapshots.append((name, state, memory))
        if not memory:
            self.cache[name.removeprefix("buildcache-")] = (f"{name}:t", state)
        return f"{name}:t"

    async def cached(self, key: str) -> tuple[str, StepState] | None:
        return self.cache.get(key[:40])

    async def parent_state(self, parent: str) -> StepState | None:
        return None

    async def kill(self, sandbox_id: str) -> None:
        self.live.discard(sandbox_id)

    async def retire(self, name: str) -> None:
        self.calls.append(("retire", name))


STEPS = [
    {"type": "COPY", "args": ["app.py", "app/", "", "0755"], "filesHash": "ab12"},
    {"type": "ENV", "args": ["A", "1", "B", "two words"]},
    {"type": "WORKDIR", "args": ["/srv"]},
    {"type": "USER", "args": ["svc"]},
    {"type": "RUN", "args": ["make"]},
    {"type": "RUN", "args": ["apt-get update", "root"]},
]


def _build(host: FakeHost, steps: list[dict], **recipe: object) -> tuple[Build, str]:
    build = Build("b1", "tpl")
    plan = Recipe("img", parse_steps(steps), **recipe)  # type: ignore[arg-type]
    files = lambda files_hash: b"archive-" + files_hash.encode()  # noqa: E731
    return build, asyncio.run(StepBuild(host, build, plan, files).run())


def test_steps_run_in_order_as_their_user_in_their_directory() -> None:
    host = FakeHost()
    build, snapshot = _build(host, STEPS, start_cmd="serve", ready_cmd="ready")
    assert snapshot == "tpl:t"
    # systemctl first; E2B's `user` only once COPY needs it (its owner and home), `svc`
    # once it runs something; then systemctl again (a step may have installed systemd).
    made = [c for c in host.calls if c[0] in ("ensure-user", "systemctl")]
    assert made == [("systemctl",), ("ensure-user", "user"), ("ensure-user", "svc"), made[-1]]
    assert made[-1] == ("systemctl",)
    runs = [c for c in host.calls if c[0] in ("run", "start", "write")]
    assert runs[0] == ("write", "/tmp/.aenv-build/ab12.tar", b"archive-ab12")
    # COPY resolves a relative destination under the default user's home, as root.
    assert runs[1][1:4] == ("set -e", "root", "/")
    assert runs[2][1:4] == ("mkdir -p /srv", "root", "/")
    assert ("run", "make", "svc", "/srv", {"A": "1", "B": "two words"}) in runs
    assert ("run", "apt-get update", "root", "/srv", {"A": "1", "B": "two words"}) in runs
    start = next(c for c in runs if c[0] == "start")
    assert start[2:] == ("svc", "/srv") and start[1].endswith("serve")
    assert "export A=1 B='two words'" in start[1]
    # Cache entries after COPY and RUN steps; the template last, with memory.
    assert [s[2] for s in host.snapshots] == [False, False, False, True]
    final = host.snapshots[-1][1]
    assert (final.user, final.workdir, final.env["B"]) == ("svc", "/srv", "two words")
    assert not host.live
    assert any(line.message == "[builder 6/7] RUN make" for line in build.logs())


def test_a_rebuild_starts_from_the_deepest_cached_step() -> None:
    host = FakeHost()
    _build(host, STEPS)
    host.calls.clear()
    build, _ = _build(host, STEPS)
    # Started from the last cache entry, nothing run again.
    assert host.calls[0][0] == "create" and host.calls[0][1].startswith("buildcache-")
    assert not [c for c in host.calls if c[0] in ("run", "write")]
    assert sum("CACHED" in line.message for line in build.logs()) == 6
    # A changed step and everything after it run again, from the entry before it (only
    # steps that change files make entries: WORKDIR and USER run again).
    host.calls.clear()
    changed = [*STEPS[:4], {"type": "RUN", "args": ["make all"]}, STEPS[5]]
    _build(host, changed)
    runs = [c[1] for c in host.calls if c[0] in ("run", "write")]
    assert runs[0] == "mkdir -p /srv" and runs[-2:] == ["make all", "apt-get update"]
    # A forced step, or a forced build, runs again from there.
    host.calls.clear()
    _build(host, [*STEPS[:5], {**STEPS[5], "force": True}])
    assert [c[1] for c in host.calls if c[0] == "run"] == ["apt-get update"]
    host.calls.clear()
    _build(host, STEPS, force=True)
    assert host.calls[0] == ("create", "img")


def test_a_cache_entry_evicted_after_its_lookup_means_a_build_from_the_parent() -> None:
    host = FakeHost()
    _build(host, STEPS)
    host.evicted = {origin for origin, _ in host.cache.values()}
    host.calls.clear()
    build, snapshot = _build(host, STEPS)
    assert snapshot == "tpl:t"
    assert [c for c in host.calls if c[0] == "create"] == [("create", "img")]
    assert [c[1] for c in host.calls if c[0] == "run"][-2:] == ["make", "apt-get update"]
    assert not any("CACHED" in line.message for line in build.logs())


def test_a_failing_step_fails_the_build_and_leaves_no_sandbox() -> None:
    host = FakeHost(exits={"make": 2})
    with pytest.raises(StepFailed, match="failed to run command 'make': exit status 2") as failed:
        _build(host, STEPS)
    assert failed.value.step == "5"  # E2B's numbering: the SDK points at that call
    assert not host.live
    unknown = [{"type": "RUN", "args": ["whoami", "nobody-here"]}]
    with pytest.raises(StepFailed) as caught:
        _build(host, unknown)
    assert caught.value.message == (
        "failed to run command 'whoami': command failed: unauthenticated: invalid username: "
        "'nobody-here'"
    )
    assert not host.live


def test_the_ready_command_is_polled_until_it_succeeds_or_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("agentenv.images.stepbuild.READY_INTERVAL", 0.0)
    monkeypatch.setattr("agentenv.images.stepbuild.DEFAULT_READY", "ready")
    host = FakeHost(ready_after=3)
    _build(host, [], start_cmd="serve", ready_cmd="ready")
    assert sum(c[1] == "ready" for c in host.calls if c[0] == "run") == 4
    # A start command alone waits as E2B's does (`sleep 20`, patched here).
    host = FakeHost()
    _build(host, [], start_cmd="serve")
    assert ("run", "ready", "user", "/home/user", {}) in host.calls
    host = FakeHost(ready_after=10**6)
    with pytest.raises(StepFailed, match="ready command 'ready' did not succeed within 0 s"):
        _build(host, [], start_cmd="serve", ready_cmd="ready", ready_timeout=0.0)
    assert not host.live


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"type": "FROM", "args": ["x"]}, "steps[0].type: 'FROM' is not one of"),
        ({"type": "RUN", "args": []}, "steps[0].args: RUN needs 1 non-empty"),
        ({"type": "ENV", "args": ["A", "1", "B"]}, "steps[0].args: ENV takes key, value"),
        ({"type": "COPY", "args": ["a", "b"]}, "steps[0].filesHash: COPY needs"),
        ({"type": "COPY", "args": ["a", "b"], "filesHash": "../x"}, "steps[0].filesHash"),
        ({"type": "RUN", "args": [1]}, "steps[0].args: a list of strings"),
        ({"type": "USER", "args": ["a; reboot"]}, "steps[0].args: 'a; reboot' is not a user"),
    ],
)
def test_malformed_steps_are_refused_by_name(step: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_steps([step])


BUSYBOX = shutil.which("busybox")


def _shell(kind: str, where: Path) -> tuple[list[str], dict[str, str] | None]:
    """How to run a script: with the host's bash and tools, or busybox's alone."""
    if kind == "bash":
        return ["bash", "-c"], None
    assert BUSYBOX is not None
    tools = where / "busybox-bin"
    if not tools.exists():
        tools.mkdir()
        applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True).stdout
        for applet in applets.split():
            (tools / applet).symlink_to(BUSYBOX)
    return [str(tools / "sh"), "-c"], {"PATH": str(tools)}


def _copied(tmp_path: Path, src: str, dest: str, **options: str) -> Path:
    """Run the COPY script on the SDK's own archive of `src`; the guest root it wrote."""
    context = tmp_path / "context"
    root = Path(tempfile.mkdtemp(dir=tmp_path, prefix="root"))
    archive = root.with_suffix(".tar")
    gzip = options.get("gzip", "yes") == "yes"
    with tar_file_stream(src, str(context), [], False, gzip) as stream:
        archive.write_bytes(stream.read())
    target = f"{root}/{dest.lstrip('/')}"
    script = copy_script(
        str(archive),
        src,
        target,
        options.get("owner", "root:root"),
        options.get("mode", ""),
        spool=str(root.with_suffix(".spool")),
    )
    shell, env = _shell(options.get("shell", "bash"), tmp_path)
    subprocess.run([*shell, script], check=True, env=env)
    return root


@pytest.fixture
def context(tmp_path: Path) -> Path:
    folder = tmp_path / "context" / "folder"
    folder.mkdir(parents=True)
    (folder / "test.txt").write_text("test")
    (folder / "symlink.txt").symlink_to("test.txt")
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.txt").write_text("deep")
    (tmp_path / "context" / "app.py").write_text("app")
    return tmp_path


@pytest.mark.parametrize("shell", ["bash", "busybox"])
def test_copy_places_files_as_docker_does(context: Path, shell: str) -> None:
    """With GNU tools, and with busybox's alone (images without bash have those)."""
    root = _copied(context, "folder/*", "folder", shell=shell)
    assert (root / "folder" / "test.txt").read_text() == "test"
    assert (root / "folder" / "symlink.txt").readlink() == Path("test.txt")
    assert (root / "folder" / "sub" / "deep.txt").read_text() == "deep"


def test_copy_of_one_file_to_a_directory_or_a_path(context: Path) -> None:
    root = _copied(context, "app.py", "/opt/app/", mode="0755")
    assert (root / "opt" / "app" / "app.py").stat().st_mode & 0o777 == 0o755
    root = _copied(context, "app.py", "/usr/local/bin/tool", gzip="no", shell="busybox")
    assert (root / "usr" / "local" / "bin" / "tool").read_text() == "app"


def test_copy_of_a_directory_puts_its_contents_at_the_destination(context: Path) -> None:
    root = _copied(context, "folder", "/srv/data")
    assert (root / "srv" / "data" / "test.txt").read_text() == "test"
    assert (root / "srv" / "data" / "sub" / "deep.txt").is_file()
    # A symlink is placed as a symlink, owned as asked.
    root = _copied(context, "folder/symlink.txt", "folder/symlink.txt", owner="nobody:nogroup")
    link = root / "folder" / "symlink.txt"
    assert link.readlink() == Path("test.txt") and link.lstat().st_uid == 65534


def test_copy_of_what_was_not_uploaded_says_so(context: Path, tmp_path: Path) -> None:
    archive = tmp_path / "files.tar"
    with tar_file_stream("app.py", str(tmp_path / "context"), [], False, True) as stream:
        archive.write_bytes(stream.read())
    script = copy_script(
        str(archive), "lib/*.py", str(tmp_path / "out"), "root:root", "", str(tmp_path / "s")
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert done.returncode == 1
    assert "COPY: lib is not in the uploaded files" in done.stderr


def test_env_values_are_expanded_by_the_shell_over_earlier_ones() -> None:
    steps = [
        {"type": "ENV", "args": ["A", "1", "HOME_BIN", "/opt/bin"]},
        {"type": "ENV", "args": ["B", "$A-x", "P", "${HOME_BIN}:$UNSET", "Q", 'q"`$(id)`\\n']},
        {"type": "ENV", "args": ["D", "\\$A is ${A}"]},
        {"type": "RUN", "args": ["make"]},
    ]
    host = FakeHost()
    _build(host, steps)
    env = next(call[4] for call in host.calls if call[:2] == ("run", "make"))
    assert env == {
        "A": "1",
        "HOME_BIN": "/opt/bin",
        "B": "1-x",
        "P": "/opt/bin:",
        "Q": 'q"`$(id)`\\n',
        "D": "$A is 1",  # an escaped dollar is literal, as in a Dockerfile
    }


def test_env_pairs_expand_in_step_order() -> None:
    """A pair sees the pairs before it (E2B's template sets JAVA_VERSION and JAVA_HOME
    from it in one step); a step sees what was set before it, never after; WORKDIR, USER
    and COPY's destination expand too."""
    steps = [
        {"type": "ENV", "args": ["JAVA_VERSION", "11", "JAVA_HOME", "/jvm/jdk-${JAVA_VERSION}"]},
        {"type": "ENV", "args": ["APP", "/srv/$JAVA_VERSION", "WHO", "svc", "LATER", "$LATE"]},
        {"type": "WORKDIR", "args": ["$APP"]},
        {"type": "USER", "args": ["${WHO}"]},
        {"type": "RUN", "args": ["make"]},
        {"type": "ENV", "args": ["LATE", "set-after", "JAVA_VERSION", "17"]},
    ]
    host = FakeHost()
    _build(host, steps)
    make = next(call for call in host.calls if call[:2] == ("run", "make"))
    assert make[2:4] == ("svc", "/srv/11")
    assert make[4] == {
        "JAVA_VERSION": "11",
        "JAVA_HOME": "/jvm/jdk-11",
        "APP": "/srv/11",
        "WHO": "svc",
        "LATER": "",
    }
    final = host.snapshots[-1][1]
    assert (final.user, final.workdir, final.env["JAVA_VERSION"]) == ("svc", "/srv/11", "17")
    assert final.env["JAVA_HOME"] == "/jvm/jdk-11"


def test_the_e2b_user_is_made_only_when_needed_after_the_images_own_steps() -> None:
    """A Dockerfile's `useradd -m user` runs before the builder makes sure of `user`
    (which then only gets its sudo rule), and root's steps never make it."""
    steps = [
        {"type": "USER", "args": ["root"]},
        {"type": "WORKDIR", "args": ["/"]},
        {"type": "RUN", "args": ["useradd -m user"]},
        {"type": "USER", "args": ["user"]},
        {"type": "WORKDIR", "args": ["/home/user"]},
    ]
    host = FakeHost()
    _build(host, steps)
    order = [c[:2] for c in host.calls if c[0] in ("run", "ensure-user")]
    assert order.index(("run", "useradd -m user")) < order.index(("ensure-user", "user"))
    host = FakeHost()
    _build(host, steps[:3])
    # The template's sandboxes run as the last USER: root, so `user` is never made.
    assert ("ensure-user", "user") not in host.calls
    assert host.snapshots[-1][1].user == "root" and host.snapshots[-1][1].workdir == "/"


def test_an_sdk_build_without_user_or_workdir_ends_as_user_in_its_home() -> None:
    host = FakeHost()
    _build(host, [{"type": "RUN", "args": ["make"]}])
    assert ("run", "make", "user", "/home/user", {}) in host.calls
    final = host.snapshots[-1][1]
    assert (final.user, final.workdir) == ("user", "/home/user")


def test_free_disk_space_is_grown_before_and_after_the_steps() -> None:
    host = FakeHost()
    _build(host, STEPS, min_free_disk_mb=8192)
    grows = [c[1] for c in host.calls if c[0] == "grow"]
    assert len(grows) == 2 and all("want=$((8192 * 1024))" in g for g in grows)
    # A build asking for another size does not start from the other size's cache.
    host.calls.clear()
    _build(host, STEPS)
    assert host.calls[0] == ("create", "img")
