"""Template builds started through the E2B API: status and timestamped log lines.

Kept in memory only: a server restart forgets builds (their finished templates stay in the
template registry). Finished builds beyond `keep` are dropped, oldest first.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from ..errors import NotFound
from .progress import parse_byte_progress

BuildStatus = Literal["waiting", "building", "ready", "error"]
LogLevel = Literal["debug", "info", "warn", "error"]
LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warn", "error")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class BuildLog:
    """One log line of a build."""

    timestamp: str
    level: LogLevel
    message: str


@dataclass
class Build:
    """One build of a template; a worker thread appends to it while the API reads it."""

    build_id: str
    template_id: str
    status: BuildStatus = "waiting"
    reason: str | None = None
    failed_step: str | None = None
    created_at: str = field(default_factory=_now)
    finished_at: str | None = None
    # Sandbox size the template will carry (E2B's cpuCount/memoryMB), when asked for.
    vcpus: int | None = None
    memory_mb: int | None = None
    # Free disk space the build grows the template's filesystem to (E2B's minFreeDiskMb).
    min_free_disk_mb: int | None = None
    # Tags the finished build gets (E2B's `name:tag` and `tags`).
    tags: list[str] = field(default_factory=lambda: ["default"])
    _logs: list[BuildLog] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def log(self, message: str, level: LogLevel = "info") -> None:
        with self._lock:
            self._logs.append(BuildLog(_now(), level, message))

    def logs(self, min_level: LogLevel | None = None) -> list[BuildLog]:
        """A snapshot of the log, optionally only lines at `min_level` or above."""
        with self._lock:
            lines = list(self._logs)
        if min_level is None:
            return lines
        floor = LEVELS.index(min_level)
        return [line for line in lines if LEVELS.index(line.level) >= floor]

    def start(self) -> None:
        self.status = "building"

    def succeed(self, message: str) -> None:
        self.log(message)
        self.finished_at = _now()
        self.status = "ready"

    def fail(self, reason: str, step: str | None = None) -> None:
        """Failed; `step` is where, as E2B names it ("base", a step's number, "finalize")."""
        self.log(reason, "error")
        self.reason = reason
        self.failed_step = step
        self.finished_at = _now()
        self.status = "error"

    @property
    def finished(self) -> bool:
        return self.status in ("ready", "error")

    def progress(self, interval: float = 1.0) -> Callable[[str], None]:
        """A pull progress callback that logs byte counters at most once per `interval`."""
        last: dict[str, float] = {}

        def report(line: str) -> None:
            counter = parse_byte_progress(line)
            if counter:
                now = time.monotonic()
                # A download reports every chunk; keep the first, the last, one per interval.
                recent = now - last.get(counter.label, -interval) < interval
                if counter.done != counter.total and recent:
                    return
                last[counter.label] = now
            self.log(line)

        return report


class BuildTracker:
    """Builds by id, in memory; see the module docstring."""

    def __init__(self, keep: int = 256) -> None:
        self._keep = keep
        self._builds: dict[str, Build] = {}
        self._lock = threading.Lock()

    def create(self, template_id: str) -> Build:
        build = Build(str(uuid.uuid4()), template_id)
        with self._lock:
            self._builds[build.build_id] = build
            self._prune()
        return build

    def get(self, template_id: str, build_id: str) -> Build:
        """The build, which must belong to `template_id`; NotFound otherwise."""
        with self._lock:
            build = self._builds.get(build_id)
        if build is None or build.template_id != template_id:
            raise NotFound(f"build '{build_id}' of template '{template_id}' not found")
        return build

    def recent(self) -> list[Build]:
        """Every build kept, newest first."""
        with self._lock:
            return list(reversed(self._builds.values()))

    def of_template(self, template_id: str) -> list[Build]:
        """The template's builds, oldest first."""
        with self._lock:
            return [b for b in self._builds.values() if b.template_id == template_id]

    def _prune(self) -> None:
        excess = len(self._builds) - self._keep
        if excess <= 0:
            return
        # Running builds stay: a worker still writes to them and a client still polls.
        for build_id in [b.build_id for b in self._builds.values() if b.status != "building"]:
            if excess <= 0:
                break
            del self._builds[build_id]
            excess -= 1
