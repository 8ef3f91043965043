"""Where the CLI finds the server: `~/.config/aenv/credentials.json`, overridden by env vars."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "AENV_API_URL"
ENV_KEY = "AENV_API_KEY"


@dataclass(frozen=True)
class Credentials:
    """Server base URL and API key (empty when none is configured)."""

    url: str = DEFAULT_URL
    key: str = ""


def credentials_path() -> Path:
    """The credentials file of the current user."""
    return Path.home() / ".config" / "aenv" / "credentials.json"


def read_file(path: Path | None = None) -> Credentials | None:
    """The stored credentials, or None if there is no readable file."""
    path = path or credentials_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"cannot read {path}: not a JSON object")
    return Credentials(url=str(data.get("url") or DEFAULT_URL), key=str(data.get("key") or ""))


def load_credentials(env: Mapping[str, str] | None = None, path: Path | None = None) -> Credentials:
    """Defaults, then the file, then `AENV_API_URL` / `AENV_API_KEY`."""
    env = os.environ if env is None else env
    stored = read_file(path) or Credentials()
    url = env.get(ENV_URL) or stored.url
    key = env.get(ENV_KEY) or stored.key
    return Credentials(url=url.rstrip("/"), key=key)


def save_credentials(creds: Credentials, path: Path | None = None) -> Path:
    """Write the file atomically with mode 0600 (its directory 0700 when created)."""
    path = path or credentials_path()
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"url": creds.url, "key": creds.key}, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
