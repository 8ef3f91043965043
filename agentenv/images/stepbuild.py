"""A template built from steps: a build sandbox runs them, then becomes the template.

The build sandbox starts from the parent (an image's template, `base`, or another built
template). Every step runs in it through its guest agent, as the user and in the
directory the steps so far set; a start command is left running and its ready command
polled; then the sandbox is snapshotted with its memory under the template's name, so
the template's sandboxes resume with everything (the start command too) already there.
After each step that changes files the disk is kept as a cache entry keyed by the step
and its parent, and a later build with the same prefix starts from the deepest entry.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from ..errors import AenvError, NotFound
from ..guest.rpc import ConnectError
from .builds import Build
from .buildscripts import DEFAULT_USER, grow_script, systemctl_script, user_script
from .buildsteps import Step, StepState, is_user_name, step_key

# Where a COPY step's archive waits in the build sandbox while it is unpacked.
COPY_SPOOL = "/tmp/.aenv-build"
SHELL = "/bin/bash"
# Every step cache entry's snapshot name starts with it.
CACHE_ENTRY_PREFIX = "buildcache-"
# As E2B: the ready command is tried every 2 s; a start command alone waits 20 s.
READY_INTERVAL = 2.0
DEFAULT_READY = "sleep 20"


class StepFailed(AenvError):
    """A step failed in the build sandbox; the message says why, `step` where."""

    status = 400

    def __init__(self, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


class BuildHost(Protocol):
    """Build sandboxes on this node (`runtime/node/buildhost.py`); faked in unit tests."""

    async def create(self, parent: str, vcpus: int | None, memory_mb: int | None) -> str: ...

    async def identity(self, parent: str) -> str:
        """What `parent` holds now (a rebuilt parent is a new identity); NotFound if none."""
        ...

    async def run(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        user: str | None,
        cwd: str | None,
        env: dict[str, str],
        output: Callable[[str], None] | None,
    ) -> int: ...

    async def start(
        self, sandbox_id: str, argv: list[str], *, user: str | None, cwd: str | None
    ) -> None: ...

    async def write(self, sandbox_id: str, path: str, data: bytes) -> None: ...

    async def snapshot(self, sandbox_id: str, name: str, state: StepState, memory: bool) -> str:
        """The snapshot id; the sandbox runs on."""
        ...

    async def cached(self, key: str) -> tuple[str, StepState] | None:
        """The cache entry for `key`: a snapshot id and the state it was taken in."""
        ...

    async def parent_state(self, parent: str) -> StepState | None:
        """What a template built from steps leaves to builds on it; None for others."""
        ...

    async def kill(self, sandbox_id: str) -> None: ...

    async def tag(self, snapshot_id: str, tags: list[str]) -> None:
        """Give the build `snapshot_id` the template tags `tags`."""
        ...

    async def retire(self, name: str) -> None:
        """Forget the builds from steps of template `name` (a pull or copy replaced it)."""
        ...


@dataclass
class Recipe:
    """What to build: the parent, the steps, and the start and ready commands."""

    parent: str
    steps: list[Step]
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False
    # Seconds the ready command has to succeed.
    ready_timeout: float = 600.0
    # Free space the root filesystem is grown to have, in MiB (E2B's minFreeDiskMb).
    min_free_disk_mb: int | None = None


def cache_entry_name(key: str) -> str:
    """The snapshot name a cache entry is kept under."""
    return f"{CACHE_ENTRY_PREFIX}{key[:40]}"


class StepBuild:
    """Runs one recipe for one build on a `BuildHost`; `files` gives a COPY step's archive
    by its hash."""

    def __init__(
        self, host: BuildHost, build: Build, recipe: Recipe, files: Callable[[str], bytes]
    ) -> None:
        self.host = host
        self.build = build
        self.recipe = recipe
        self.files = files
        self._total = len(recipe.steps) + 1
        # Accounts made sure of in this build's sandbox (made when first needed).
        self._users: set[str] = {"root"}

    def _log(self, number: int, text: str) -> None:
        self.build.log(f"[builder {number}/{self._total}] {text}")

    async def run(self) -> str:
        """Build, and return the id of the template's snapshot."""
        recipe = self.recipe
        build = self.build
        parent = await self.host.identity(recipe.parent)
        keys, key = [], f"{parent}:{build.vcpus}:{build.memory_mb}"
        if recipe.min_free_disk_mb:
            key += f":disk{recipe.min_free_disk_mb}"
        for step in recipe.steps:
            key = step_key(key, step)
            keys.append(key)
        start, state, origin = await self._deepest_cached(keys)
        self._log(1, f"FROM {recipe.parent}")
        try:
            try:
                sandbox = await self.host.create(origin, build.vcpus, build.memory_mb)
            except NotFound:
                if start == 0:
                    raise
                # Its cache entry was evicted since it was found (another build took the
                # cache past its bound): every step runs, from the parent.
                start, state = 0, StepState()
                sandbox = await self.host.create(recipe.parent, build.vcpus, build.memory_mb)
        except AenvError as exc:
            raise StepFailed(exc.message, "base") from exc
        try:
            if start == 0:
                state = await self.host.parent_state(recipe.parent) or StepState()
                try:
                    await self._prepare(sandbox, state)
                except StepFailed as exc:
                    raise StepFailed(exc.message, "base") from exc
            for index, step in enumerate(recipe.steps):
                number = index + 2
                if index < start:
                    self._log(number, f"CACHED {step.describe()}")
                    continue
                self._log(number, step.describe())
                try:
                    state = state.after(await self._apply(sandbox, step, state))
                except StepFailed as exc:
                    raise StepFailed(exc.message, str(index + 1)) from exc
                if step.kind in ("COPY", "RUN"):
                    name = cache_entry_name(keys[index])
                    await self.host.snapshot(sandbox, name, state, memory=False)
            try:
                state = await self._settled(sandbox, state)
                await self._prepare(sandbox, state)
                await self._start(sandbox, state)
            except StepFailed as exc:
                raise StepFailed(exc.message, "finalize") from exc
            return await self.host.snapshot(sandbox, build.template_id, state, memory=True)
        finally:
            await self.host.kill(sandbox)

    async def _prepare(self, sandbox: str, state: StepState) -> None:
        """Before the steps and again after them (a step may have installed systemd): the
        `systemctl` stand-in, and the free disk space the build asked for."""
        await self._run(sandbox, systemctl_script(), "root", state, "/", "install systemctl")
        if self.recipe.min_free_disk_mb:
            what = f"grow the disk to {self.recipe.min_free_disk_mb} MiB free"
            await self._run(
                sandbox, grow_script(self.recipe.min_free_disk_mb), "root", state, "/", what
            )

    async def _settled(self, sandbox: str, state: StepState) -> StepState:
        """`state` with its user made and its directory known: as E2B, steps that never
        named them leave `user` in its home."""
        user = state.user or DEFAULT_USER
        await self._need_user(sandbox, user, state)
        if state.workdir:
            return replace(state, user=user)
        return replace(state, user=user, workdir=await self._home(sandbox, user, state))

    async def _home(self, sandbox: str, user: str, state: StepState) -> str:
        """Where `user` starts: its home (the sandbox's default directory for it)."""
        await self._need_user(sandbox, user, state)
        lines: list[str] = []
        argv = ["/bin/sh", "-c", "pwd"]
        code = await self.host.run(sandbox, argv, user=user, cwd=None, env={}, output=lines.append)
        if code != 0 or not lines or not lines[-1].startswith("/"):
            raise StepFailed(f"user '{user}' has no usable home directory: {lines}")
        return lines[-1]

    async def _workdir(self, sandbox: str, state: StepState) -> str:
        """The directory steps run in: the last WORKDIR, else the step user's home."""
        return state.workdir or await self._home(sandbox, state.user or DEFAULT_USER, state)

    async def _need_user(self, sandbox: str, user: str, state: StepState) -> None:
        """Make sure of account `user` when first needed: never before the image's own
        steps could make it (E2B's templates run `useradd -m user` themselves)."""
        if user in self._users or user.isdigit():
            return
        await self._run(sandbox, user_script(user), "root", state, "/", f"create user '{user}'")
        self._users.add(user)

    async def _deepest_cached(self, keys: list[str]) -> tuple[int, StepState, str]:
        """(steps already done, their state, the sandbox origin) for the longest cached
        prefix not invalidated by a forced step."""
        recipe = self.recipe
        usable = 0 if recipe.force else len(keys)
        for index, step in enumerate(recipe.steps):
            if step.force:
                usable = min(usable, index)
                break
        for done in range(usable, 0, -1):
            found = await self.host.cached(keys[done - 1])
            if found is not None:
                snapshot_id, state = found
                return done, state, snapshot_id
        return 0, StepState(), recipe.parent

    async def _apply(self, sandbox: str, step: Step, state: StepState) -> Step:
        """Carry out `step`; the step as carried out (its values expanded over the ENV so
        far, as Docker does)."""
        if step.kind == "ENV":
            names = list(step.args[::2])
            values = await self._expand(sandbox, list(step.args[1::2]), state, names)
            pairs = [part for pair in zip(names, values, strict=True) for part in pair]
            return replace(step, args=tuple(pairs))
        if step.kind == "RUN":
            # The step's user (USER, else E2B's `user`) is made when first needed; one a
            # RUN names itself must exist.
            default = state.user or DEFAULT_USER
            user = step.args[1] if len(step.args) > 1 and step.args[1] else default
            if user == default:
                await self._need_user(sandbox, user, state)
            # Not yet anywhere: the step user's home (E2B's, `user`'s, once it exists).
            cwd = state.workdir
            if cwd is None and user == default:
                cwd = await self._workdir(sandbox, state)
            await self._run(sandbox, step.args[0], user, state, cwd)
            return step
        if step.kind == "USER":
            user = await self._expand_one(sandbox, step.args[0], state)
            if not is_user_name(user):
                raise StepFailed(f"USER {step.args[0]}: {user!r} is not a user name")
            return replace(step, args=(user,))
        if step.kind == "WORKDIR":
            path = await self._expand_one(sandbox, step.args[0], state)
            # The directory is the step user's: that user exists before it is made.
            user = state.user or DEFAULT_USER
            await self._need_user(sandbox, user, state)
            base = state if path.startswith("/") else replace(
                state, workdir=await self._workdir(sandbox, state)
            )  # fmt: skip
            path = base.resolve(path)
            await self._run(sandbox, f"mkdir -p {shlex.quote(path)}", "root", state, "/")
            return replace(step, args=(path,))
        if step.kind == "COPY":
            dest = await self._expand_one(sandbox, step.args[1], state)
            step = replace(step, args=(step.args[0], dest, *step.args[2:]))
            await self._copy(sandbox, step, state)
        return step

    async def _expand_one(self, sandbox: str, value: str, state: StepState) -> str:
        if "$" not in value:
            return value
        return (await self._expand(sandbox, [value], state))[0]

    async def _expand(
        self, sandbox: str, values: list[str], state: StepState, names: list[str] | None = None
    ) -> list[str]:
        """`values` with `$VAR` and `${VAR}` expanded by the shell, as root, over the
        sandbox's env and the build's so far; with `names`, each is set once expanded, so
        a later pair sees an earlier one (as E2B: its template sets JAVA_VERSION and uses
        it in JAVA_HOME in one step). Quotes, backslashes and `$(...)` stay literal."""
        marker = f"--aenv-env-{secrets.token_hex(8)}--"
        lines = ["exec 2>/dev/null"]
        for index, value in enumerate(values):
            quoted = f'"{_escape(value)}"'
            if names is not None:
                lines.append(f"export {names[index]}={quoted}")
                quoted = f'"${names[index]}"'
            lines.append(f"printf '%s\\n' {quoted}; echo {marker}")
        out: list[str] = []
        try:
            code = await self.host.run(
                sandbox, [SHELL, "-c", "\n".join(lines)], user="root", cwd="/",
                env=state.env, output=out.append,
            )  # fmt: skip
        except ConnectError as exc:
            raise StepFailed(f"failed to evaluate environment variable: {exc}") from exc
        if code != 0:
            raise StepFailed(f"failed to evaluate environment variable: exit status {code}")
        expanded: list[str] = []
        current: list[str] = []
        for line in out:
            if line == marker:
                expanded.append("\n".join(current))
                current = []
            else:
                current.append(line)
        if len(expanded) != len(values):
            raise StepFailed(f"failed to evaluate environment variable: got {out}")
        return expanded

    async def _run(
        self,
        sandbox: str,
        command: str,
        user: str | None,
        state: StepState,
        cwd: str | None,
        what: str | None = None,
    ) -> None:
        """Run `command`; StepFailed says `what` failed (by default, the command)."""
        what = what or f"run command '{command}'"
        try:
            code = await self.host.run(
                sandbox,
                [SHELL, "-l", "-c", command],
                user=user,
                cwd=cwd,
                env=state.env,
                output=self.build.log,
            )
        except ConnectError as exc:
            raise StepFailed(f"failed to {what}: command failed: {exc}") from exc
        if code != 0:
            raise StepFailed(f"failed to {what}: exit status {code}")

    async def _copy(self, sandbox: str, step: Step, state: StepState) -> None:
        src, dest = step.args[0], step.args[1]
        owner = step.args[2] if len(step.args) > 2 else ""
        mode = step.args[3] if len(step.args) > 3 else ""
        if not owner:
            owner = state.user or DEFAULT_USER
            await self._need_user(sandbox, owner, state)
        if ":" not in owner:
            owner = f"{owner}:{owner}"
        assert step.files_hash is not None  # parse_steps requires it
        data = await asyncio.to_thread(self.files, step.files_hash)
        archive = f"{COPY_SPOOL}/{step.files_hash}.tar"
        await self.host.write(sandbox, archive, data)
        if not dest.startswith("/"):
            state = replace(state, workdir=await self._workdir(sandbox, state))
        target = state.resolve(dest) + ("/" if dest.endswith("/") else "")
        script = copy_script(archive, src, target, owner, mode)
        await self._run(sandbox, script, "root", state, "/", f"copy '{src}' to '{dest}'")

    async def _start(self, sandbox: str, state: StepState) -> None:
        """Leave the start command running, then wait until the ready command succeeds."""
        recipe = self.recipe
        if recipe.start_cmd:
            self.build.log(f"Running start command: {recipe.start_cmd}")
            try:
                await self.host.start(
                    sandbox,
                    [SHELL, "-l", "-c", _with_env(recipe.start_cmd, state.env)],
                    user=state.user,
                    cwd=state.workdir,
                )
            except ConnectError as exc:
                raise StepFailed(f"start command failed to start: {exc}") from exc
        ready = recipe.ready_cmd or (DEFAULT_READY if recipe.start_cmd else None)
        if not ready:
            return
        self.build.log(f"Waiting for template to be ready: {ready}")
        deadline = time.monotonic() + recipe.ready_timeout
        while True:
            code = await self.host.run(
                sandbox,
                [SHELL, "-l", "-c", ready],
                user=state.user,
                cwd=state.workdir,
                env=state.env,
                output=None,
            )
            if code == 0:
                self.build.log("Template is ready")
                return
            if time.monotonic() > deadline:
                raise StepFailed(
                    f"ready command '{ready}' did not succeed within "
                    f"{recipe.ready_timeout:.0f} s (last exit status {code})"
                )
            await asyncio.sleep(READY_INTERVAL)


def _escape(value: str) -> str:
    """`value` for the inside of a double-quoted shell word: `$VAR` and `${VAR}` expand,
    everything else (quotes, backslashes, backticks, `$(...)`) stays as written; `\\$`
    is a literal dollar, as in a Dockerfile."""
    out = []
    index = 0
    while index < len(value):
        char = value[index]
        if char == "\\" and value[index + 1 : index + 2] == "$":
            out.append("\\$")
            index += 2
            continue
        if char == "$" and value[index + 1 : index + 2] == "(":
            out.append("\\$")
        elif char in '\\"`':
            out.append("\\" + char)
        else:
            out.append(char)
        index += 1
    return "".join(out)


def _with_env(command: str, env: dict[str, str]) -> str:
    """`command` with the build's ENV exported first (a detached start takes no env)."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"export {exports}; {command}" if exports else command


def copy_script(
    archive: str, src: str, target: str, owner: str, mode: str, spool: str = COPY_SPOOL
) -> str:
    """The shell that unpacks a COPY step's archive and places what `src` names, as E2B
    does: the archive holds the matched paths under their context-relative names, so the
    entry is `src` up to its first glob. A file or symlink goes to `target` (inside it
    when `target` ends in "/"); a directory's contents are merged into `target`."""
    q = shlex.quote
    entry = copy_source(src)
    mode_tree = f'chmod -R {q(mode)} "$entry"' if mode else ":"
    mode_file = f'[ -L "$entry" ] || chmod {q(mode)} "$entry"' if mode else ":"
    return "\n".join(
        [
            "set -e",
            f"mkdir -p {q(spool)}; spool=$(mktemp -d {q(spool)}/unpack.XXXXXX)",
            # gzip'd unless the SDK was told not to; not every tar can tell by itself.
            f'tar -xzf {q(archive)} -C "$spool" 2>/dev/null || tar -xf {q(archive)} -C "$spool"',
            f"rm -f {q(archive)}",
            f'cd "$spool"; entry={q(entry)}; target={q(target)}',
            'if [ ! -e "$entry" ] && [ ! -L "$entry" ]; then',
            f"  echo {q(f'COPY: {entry} is not in the uploaded files')} >&2; exit 1",
            "fi",
            'if [ -d "$entry" ] && [ ! -L "$entry" ]; then',
            f'  chown -R {q(owner)} "$entry"',
            f"  {mode_tree}",
            '  mkdir -p "$target"',
            # tar merges into existing directories and replaces files, as Docker's COPY.
            # (GNU tar's options to keep symlinked and existing directories; busybox
            # has neither.)
            "  opts=; if tar --help 2>&1 | grep -q keep-directory-symlink; then",
            '    opts="--keep-directory-symlink --no-overwrite-dir"; fi',
            '  (cd "$entry" && tar -cf - .) | tar -xf - -C "$target" $opts',
            "else",
            f'  chown -h {q(owner)} "$entry"',
            f"  {mode_file}",
            '  case "$target" in */) mkdir -p "$target" ;;',
            '    *) mkdir -p "$(dirname "$target")" ;; esac',
            '  mv -f "$entry" "$target"',
            "fi",
            'cd /; rm -rf "$spool"',
        ]
    )


def copy_source(src: str) -> str:
    """The path in a COPY archive that `src` names: its components before the first glob."""
    parts = []
    for part in src.strip("/").split("/"):
        if any(c in part for c in "*?[{"):
            break
        parts.append(part)
    return "/".join(parts) or "."
