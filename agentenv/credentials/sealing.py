"""The server key: what seals secret values and identity signing keys at rest.

AES-256-GCM, a random nonce per value, and the row the value belongs to as associated
data (a sealed value copied into another row does not open). The key is derived with
HKDF-SHA256 from `server.secrets_key`, or, when that is empty, from the API key: every
node and control plane of a cluster already shares it, so a cluster works with no more
configuration. Each key has an id (a digest that reveals nothing of it) stored beside
what it sealed, so the key can rotate: former keys (`server.secrets_old_keys`) still
open what they sealed, and `reseal` moves it to the current key.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..config import Config, ConfigError
from ..errors import DependencyFailed
from ..state.credentials import Sealed

log = logging.getLogger(__name__)

# A configured key shorter than this is refused: it would be guessable offline.
MIN_KEY_CHARS = 32
_NONCE = 12


class SealError(DependencyFailed):
    """A sealed value this server cannot open: sealed with a key it lacks, or altered."""

    part = "the server key"


def derive_key(material: str) -> bytes:
    """The AES key from a configured key or an API key."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"aenv", info=b"aenv server key")
    return hkdf.derive(material.encode())


def key_id(key: bytes) -> str:
    return hmac.new(key, b"aenv key id", hashlib.sha256).hexdigest()[:16]


class Sealer:
    """Seals with the current key; opens with it or any former one."""

    def __init__(self, current: bytes, former: tuple[bytes, ...] = ()) -> None:
        self.key_id = key_id(current)
        self._keys = {key_id(key): AESGCM(key) for key in former}
        self._keys[self.key_id] = AESGCM(current)

    def seal(self, plaintext: bytes, context: str) -> Sealed:
        """`plaintext` sealed for the row `context` names."""
        nonce = os.urandom(_NONCE)
        box = self._keys[self.key_id]
        return Sealed(self.key_id, nonce + box.encrypt(nonce, plaintext, context.encode()))

    def open(self, sealed: Sealed, context: str) -> bytes:
        box = self._keys.get(sealed.key_id)
        if box is None:
            raise SealError(
                f"sealed with key {sealed.key_id}, which this server does not have"
                " (server.secrets_key, server.secrets_old_keys)"
            )
        try:
            return box.decrypt(sealed.sealed[:_NONCE], sealed.sealed[_NONCE:], context.encode())
        except InvalidTag:
            raise SealError(f"the value of {context} does not open: altered or misplaced") from None

    def reseal(self, sealed: Sealed, context: str) -> Sealed | None:
        """`sealed` under the current key; None when it already is, or when it does not
        open (logged: the server runs on, and only that value is unusable)."""
        if sealed.key_id == self.key_id:
            return None
        try:
            return self.seal(self.open(sealed, context), context)
        except SealError as exc:
            log.error("%s: %s", context, exc)
            return None


def server_sealer(cfg: Config, api_key: str) -> Sealer:
    """The server's sealer: `server.secrets_key`, else one derived from the API key."""
    configured = cfg.server.secrets_key
    former = [k.strip() for k in cfg.server.secrets_old_keys.split(",") if k.strip()]
    for key in (configured, *former):
        if key and len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"server secret keys must be at least {MIN_KEY_CHARS} characters")
    current = derive_key(configured or api_key)
    return Sealer(current, tuple(derive_key(k) for k in former))
