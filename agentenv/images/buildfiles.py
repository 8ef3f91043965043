"""The files of COPY steps: archives the SDKs upload once per content hash.

They live in the object store (`build-files/<hash>`), so a later build with the same
files uploads nothing (`present`). Uploads go to a URL that carries its own signature,
as E2B's presigned URLs do: the SDK sends no API key with them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from pathlib import Path

from ..errors import NotFound
from ..storage.objectstore import ObjectNotFound, ObjectStore
from .buildsteps import is_files_hash

# How long an upload URL stays good.
UPLOAD_URL_SECONDS = 3600


def _key(files_hash: str) -> str:
    return f"build-files/{files_hash.lower()}"


class BuildFiles:
    """Archives by hash, and signatures for their upload URLs."""

    def __init__(self, store: ObjectStore, secret: bytes | None = None) -> None:
        self._store = store
        # Shared by a cluster's nodes (`signing_key`), so any of them takes an upload URL
        # another gave out; without one, this process's own.
        self._secret = secret or secrets.token_bytes(32)

    def present(self, files_hash: str) -> bool:
        return self._store.exists(_key(files_hash))

    def get(self, files_hash: str) -> bytes:
        try:
            return self._store.get(_key(files_hash))
        except ObjectNotFound:
            raise NotFound(f"the files of hash {files_hash} were never uploaded") from None

    def put(self, files_hash: str, path: Path) -> None:
        self._store.put_file(_key(files_hash), path)

    def signature(self, files_hash: str, expires: int) -> str:
        message = f"{files_hash.lower()}:{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def upload_query(self, files_hash: str) -> str:
        """The query string of a signed upload URL for `files_hash`."""
        expires = int(time.time()) + UPLOAD_URL_SECONDS
        return f"expires={expires}&signature={self.signature(files_hash, expires)}"

    def signed(self, files_hash: str, expires: str, signature: str) -> bool:
        if not (is_files_hash(files_hash) and expires.isdigit()) or int(expires) < time.time():
            return False
        return hmac.compare_digest(self.signature(files_hash, int(expires)), signature)


def signing_key(api_key: str) -> bytes:
    """The upload URLs' key, derived from the API key every node of a cluster shares (and
    not revealing it)."""
    return hmac.new(api_key.encode(), b"aenv build-file uploads", hashlib.sha256).digest()
