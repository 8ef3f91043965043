"""Language names the SDKs send -> the Jupyter kernel that runs them, and the code that
sets an environment variable in each."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass


class UnknownLanguage(ValueError):
    """A language no kernel of this service runs."""


@dataclass(frozen=True)
class Language:
    name: str
    kernel: str  # the kernelspec's name

    @property
    def output_trails_idle(self) -> bool:
        """Deno's kernel publishes a cell's output after the cell's status idle."""
        return self.kernel == "deno"

    @property
    def start_timeout(self) -> float:
        """Seconds a new kernel has to answer: a JVM under QEMU's software emulation took
        77 s (measured), the others a few seconds."""
        return 240.0 if self.kernel == "java" else 60.0

    @property
    def interrupt_by_message(self) -> bool:
        """Deno's kernel dies of SIGINT but stops a cell on an interrupt_request."""
        return self.kernel == "deno"

    def set_env(self, env: dict[str, str]) -> str:
        """Code that sets these variables in the kernel's process (Java: system properties)."""
        return "\n".join(self._set(key, value) for key, value in env.items())

    def unset_env(self, keys: list[str]) -> str:
        return "\n".join(self._unset(key) for key in keys)

    def _set(self, key: str, value: str) -> str:
        k, v = json.dumps(key), json.dumps(value)
        if self.kernel == "python3":
            return f"__import__('os').environ[{k}] = {v}"
        if self.kernel == "deno":
            return f"Deno.env.set({k}, {v});"
        if self.kernel == "ir":
            return f"do.call(Sys.setenv, setNames(list({v}), {k}))"
        if self.kernel == "bash":
            return f"export {shlex.quote(key)}={shlex.quote(value)}"
        return f"System.setProperty({k}, {v});"

    def _unset(self, key: str) -> str:
        k = json.dumps(key)
        if self.kernel == "python3":
            return f"__import__('os').environ.pop({k}, None)"
        if self.kernel == "deno":
            return f"Deno.env.delete({k});"
        if self.kernel == "ir":
            return f"Sys.unsetenv({k})"
        if self.kernel == "bash":
            return f"unset {shlex.quote(key)}"
        return f"System.clearProperty({k});"


PYTHON = Language("python", "python3")
# What a context reports as its language: E2B's names (js -> javascript, ts -> typescript).
_LANGUAGES = {
    "python": PYTHON,
    "javascript": Language("javascript", "deno"),
    "typescript": Language("typescript", "deno"),
    "r": Language("r", "ir"),
    "bash": Language("bash", "bash"),
    "java": Language("java", "java"),
}
_ALIASES = {"js": "javascript", "ts": "typescript", "python3": "python", "sh": "bash"}


def language(name: str | None) -> Language:
    """The language for a name the SDK sends (case and spaces ignored; none is Python)."""
    key = (name or "python").strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _LANGUAGES:
        raise UnknownLanguage(f"language {name!r} is not supported")
    return _LANGUAGES[key]
