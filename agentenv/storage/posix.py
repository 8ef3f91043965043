"""An object store on a directory: the default backend, also fine on a shared filesystem.

Each key is a file under `root`. Writes go to a temporary file in the key's directory and
are renamed into place after fsync, so a reader sees the old object or the new one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .objectstore import ObjectNotFound, ObjectStoreError

# Temporary files share the directory of their key (rename is only atomic within one
# filesystem); this prefix keeps them out of `list` and out of the key namespace.
TEMP_PREFIX = ".tmp-"
_COPY_BUFFER = 1024 * 1024


def validate_key(key: str) -> str:
    """Refuse keys that could escape the store's root or collide with temporary files."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string: {key!r}")
    if key.startswith("/") or "\\" in key or "\0" in key:
        raise ValueError(f"object key must be a relative `/`-separated path: {key!r}")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith(TEMP_PREFIX):
            raise ValueError(f"bad object key {key!r}")
    return key


def _validate_prefix(prefix: str) -> str:
    # A prefix may end inside a component ("chunks/ab") or with "/", but must stay inside.
    if prefix.startswith("/") or "\\" in prefix or "\0" in prefix:
        raise ValueError(f"bad key prefix {prefix!r}")
    if any(part in (".", "..") for part in prefix.split("/")):
        raise ValueError(f"bad key prefix {prefix!r}")
    return prefix


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; some filesystems (and platforms) refuse, which is fine.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class PosixObjectStore:
    """ObjectStore on a local or shared directory."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"PosixObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def _publish(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        """Write a temp file with `write(fileobj)`, fsync it and rename it over `key`."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
        except OSError as exc:
            raise ObjectStoreError(f"put {key}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise ObjectStoreError(f"put {key}: {exc}") from exc
            raise
        _fsync_dir(path.parent)

    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key` atomically."""
        self._publish(key, lambda out: out.write(data))

    def put_file(self, key: str, path: Path) -> None:
        """Stream a local file into the store under `key` atomically."""

        def copy(out: BinaryIO) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, out, _COPY_BUFFER)

        self._publish(key, copy)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(key) from exc
        except OSError as exc:
            raise ObjectStoreError(f"get {key}: {exc}") from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length} for {key}")
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(key) from exc
        except OSError as exc:
            raise ObjectStoreError(f"get_range {key}: {exc}") from exc
        try:
            parts: list[bytes] = []
            done = 0
            while done < length:
                part = os.pread(fd, length - done, start + done)
                if not part:  # end of the object
                    break
                parts.append(part)
                done += len(part)
            return b"".join(parts)
        except OSError as exc:
            raise ObjectStoreError(f"get_range {key}: {exc}") from exc
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ObjectNotFound(key) from exc
        except OSError as exc:
            raise ObjectStoreError(f"size {key}: {exc}") from exc
        if not path.is_file():
            raise ObjectNotFound(key)
        return st.st_size

    def delete(self, key: str) -> None:
        # Empty directories are left behind: removing them would race a concurrent put.
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ObjectStoreError(f"delete {key}: {exc}") from exc

    def list(self, prefix: str) -> list[str]:
        """All keys starting with `prefix`, sorted; temporary files are never listed."""
        _validate_prefix(prefix)
        # Walk only the deepest directory that the prefix fully names.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith(TEMP_PREFIX):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return keys

    def ages(self, prefix: str) -> dict[str, float]:
        now = time.time()
        ages: dict[str, float] = {}
        for key in self.list(prefix):
            try:
                ages[key] = now - self._path(key).stat().st_mtime
            except FileNotFoundError:
                continue  # deleted while listing
        return ages
