"""Consume `process.Process/Start` event streams: route output, compute the exit code."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agentenv.guest.rpc import ConnectError

# Go's syscall.Signal strings as they appear in envd's `status` ("signal: killed").
_SIGNALS = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "aborted": 6,
    "killed": 9,
    "segmentation fault": 11,
    "broken pipe": 13,
    "terminated": 15,
}

Sink = Callable[[bytes], None]


@dataclass(frozen=True)
class ProcessResult:
    """How the remote process ended."""

    exit_code: int
    status: str = ""
    error: str = ""

    @property
    def signalled(self) -> bool:
        return self.status.startswith("signal:")


def exit_code_of(end: dict[str, Any]) -> ProcessResult:
    """Map an EndEvent to a shell-style exit code (128+N for a signal, 137 if unknown)."""
    status = str(end.get("status") or "")
    error = str(end.get("error") or "")
    code = int(end.get("exitCode") or 0)
    if code < 0 or (status.startswith("signal:") and not end.get("exited", True)):
        name = status.removeprefix("signal:").strip()
        return ProcessResult(128 + _SIGNALS.get(name, 9), status or "signal: killed", error)
    return ProcessResult(code, status, error)


def bash_args(script: str) -> list[str]:
    """Arguments for `/bin/bash` to run `script` as a login shell would."""
    return ["-l", "-c", script]


def _decode(value: Any) -> bytes:
    try:
        return base64.b64decode(value or b"", validate=False)
    except (ValueError, TypeError) as exc:
        raise ConnectError("internal", f"bad base64 in process output: {exc}") from exc


class ProcessStream:
    """Walk a Start/Connect stream, sending output to sinks; remembers the pid once known."""

    def __init__(
        self,
        stdout: Sink | None = None,
        stderr: Sink | None = None,
        pty: Sink | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> None:
        self.pid: int | None = None
        self._sinks = {"stdout": stdout, "stderr": stderr, "pty": pty}
        self._on_start = on_start

    def run(self, messages: Iterable[dict[str, Any]]) -> ProcessResult | None:
        """Consume the stream; the end event's result, or None if the stream had none."""
        stream = iter(messages)
        for message in stream:
            event = message.get("event") or {}
            if "start" in event:
                self.pid = int((event["start"] or {}).get("pid") or 0)
                if self._on_start:
                    self._on_start(self.pid)
            elif "data" in event:
                self._data(event["data"] or {})
            elif "end" in event:
                result = exit_code_of(event["end"] or {})
                for _ in stream:  # drain to the end-stream envelope so its error surfaces
                    pass
                return result
        return None

    def _data(self, data: dict[str, Any]) -> None:
        for name, sink in self._sinks.items():
            if name in data and sink is not None:
                sink(_decode(data[name]))
