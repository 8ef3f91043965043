"""Language names the SDKs send -> the Jupyter kernel that runs them, and the code that
sets an environment variable in each."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
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
        code = _ENV_CODE[self.kernel]
        return "\n".join(
            code.set.format(k=code.quote(key), v=code.quote(value)) for key, value in env.items()
        )

    def unset_env(self, keys: list[str]) -> str:
        code = _ENV_CODE[self.kernel]
        return "\n".join(code.unset.format(k=code.quote(key)) for key in keys)


@dataclass(frozen=True)
class _EnvCode:
    """How a kernel's language sets and unsets a variable ({k}, {v}: quoted by `quote`)."""

    set: str
    unset: str
    quote: Callable[[str], str] = json.dumps


_ENV_CODE = {
    "python3": _EnvCode(
        "__import__('os').environ[{k}] = {v}", "__import__('os').environ.pop({k}, None)"
    ),
    "deno": _EnvCode("Deno.env.set({k}, {v});", "Deno.env.delete({k});"),
    "ir": _EnvCode("do.call(Sys.setenv, setNames(list({v}), {k}))", "Sys.unsetenv({k})"),
    "bash": _EnvCode("export {k}={v}", "unset {k}", shlex.quote),
    "java": _EnvCode("System.setProperty({k}, {v});", "System.clearProperty({k});"),
}


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
