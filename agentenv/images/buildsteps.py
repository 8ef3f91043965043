"""A template's build steps as E2B's SDKs send them, and what each leaves for the next.

Steps are `COPY`, `ENV`, `RUN`, `USER` and `WORKDIR`; the SDKs' `apt_install`,
`pip_install`, `make_dir`, `make_symlink`, `git_clone` and the like arrive as `RUN`.
Each step has a cache key: its parent's key and its own content (for `COPY`, the hash of
the files), so a rebuild starts from the last step whose key it already has.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidInput

KINDS = ("COPY", "ENV", "RUN", "USER", "WORKDIR")
# Bounds on a recipe (a step's text goes into logs and cache keys).
MAX_STEPS = 256
MAX_ARG_BYTES = 64 * 1024
# A user name as useradd takes one (or a uid).
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
# An environment variable's name, as a shell takes one.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Step:
    """One build step: its kind, arguments and, for COPY, the hash of its files."""

    kind: str
    args: tuple[str, ...]
    files_hash: str | None = None
    force: bool = False

    def describe(self) -> str:
        """The step as a Dockerfile line, for logs."""
        if self.kind == "ENV":
            pairs = zip(self.args[::2], self.args[1::2], strict=True)
            return "ENV " + " ".join(f"{k}={v}" for k, v in pairs)
        if self.kind == "RUN":
            return f"RUN {self.args[0]}"
        return f"{self.kind} {' '.join(a for a in self.args if a)}"


@dataclass(frozen=True)
class StepState:
    """What the steps so far leave to the next one and to the template's sandboxes."""

    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None

    def after(self, step: Step) -> StepState:
        if step.kind == "ENV":
            pairs = dict(zip(step.args[::2], step.args[1::2], strict=True))
            return replace(self, env={**self.env, **pairs})
        if step.kind == "USER":
            return replace(self, user=step.args[0])
        if step.kind == "WORKDIR":
            return replace(self, workdir=self.resolve(step.args[0]))
        return self

    def resolve(self, path: str) -> str:
        """A step's path: relative ones are under the working directory, as in Docker."""
        if path.startswith("/"):
            return path
        base = self.workdir or "/"
        return f"{base.rstrip('/')}/{path}"


def parse_steps(raw: list[dict[str, Any]]) -> list[Step]:
    """The steps of a build request; InvalidInput naming the step that is wrong."""
    if len(raw) > MAX_STEPS:
        raise InvalidInput(f"steps: at most {MAX_STEPS} steps, {len(raw)} given")
    return [_parse(index, item) for index, item in enumerate(raw)]


def _parse(index: int, item: dict[str, Any]) -> Step:
    where = f"steps[{index}]"
    kind = item.get("type")
    if kind not in KINDS:
        raise InvalidInput(f"{where}.type: {kind!r} is not one of {', '.join(KINDS)}")
    args = item.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InvalidInput(f"{where}.args: a list of strings is required")
    if sum(len(a.encode()) for a in args) > MAX_ARG_BYTES:
        raise InvalidInput(f"{where}.args: over {MAX_ARG_BYTES} bytes")
    # At least: COPY src dest, ENV key value, RUN command, USER name, WORKDIR path.
    least = {"COPY": 2, "ENV": 2, "RUN": 1, "USER": 1, "WORKDIR": 1}[kind]
    if len(args) < least or not all(args[:least]):
        raise InvalidInput(f"{where}.args: {kind} needs {least} non-empty arguments")
    if kind == "ENV" and len(args) % 2:
        raise InvalidInput(f"{where}.args: ENV takes key, value pairs")
    bad = [name for name in args[::2] if kind == "ENV" and not _ENV_NAME.fullmatch(name)]
    if bad:
        raise InvalidInput(f"{where}.args: {bad[0]!r} is not an environment variable name")
    user = args[0] if kind == "USER" else args[1] if kind == "RUN" and len(args) > 1 else ""
    # A USER naming variables is checked once they are expanded (`is_user_name`).
    if user and not (is_user_name(user) or (kind == "USER" and "$" in user)):
        raise InvalidInput(f"{where}.args: {user!r} is not a user name")
    files_hash = item.get("filesHash")
    if kind == "COPY" and not (isinstance(files_hash, str) and is_files_hash(files_hash)):
        raise InvalidInput(f"{where}.filesHash: COPY needs the hash of its files (hex)")
    return Step(kind, tuple(args), files_hash if kind == "COPY" else None, bool(item.get("force")))


def is_user_name(text: str) -> bool:
    """A user name as useradd takes one, or a uid."""
    return _USER.fullmatch(text) is not None


def is_files_hash(text: str) -> bool:
    """A COPY step's files hash: hex, as the SDKs compute it (sha256)."""
    return 0 < len(text) <= 128 and all(c in "0123456789abcdef" for c in text.lower())


def step_key(parent_key: str, step: Step) -> str:
    """The cache key of `step` run on the result of `parent_key`."""
    content = json.dumps([parent_key, step.kind, step.args, step.files_hash])
    return hashlib.sha256(content.encode()).hexdigest()
