"""Workload identity: JWT-SVIDs a sandbox's egress presents, signed by keys the cluster
shares and publishes (OIDC discovery and a JWKS), rotated without downtime.

A key's life, by generation: published from its creation; signs from its `active_at`
(`identity.publish_ahead` after a rotation, so verifiers' cached JWKS have it before
any token it signed arrives) until the next generation's `active_at`; published until
every token it signed has expired (that time plus `identity.token_ttl` and a margin for
clocks), then removed. Nodes rotate on their own every `identity.rotation_period`;
two nodes rotating at once make one key (generations are unique).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from ..config import Config, ConfigError
from ..errors import Conflict
from ..state.credentials import SigningKeyRecord, SigningKeyStore
from ..state.sandboxes import SandboxRecord
from .sealing import Sealer

log = logging.getLogger(__name__)

# The token types a sandbox's `iam.tokens` may ask for.
JWT_SVID = "JWT-SVID"
TOKEN_TYPES = (JWT_SVID,)
ALGORITHM = "ES256"
# One team per server (as `teamID` of template builds): the tokens' `team_id`.
TEAM_ID = "default"
JWKS_PATH = "/.well-known/jwks.json"
DISCOVERY_PATH = "/.well-known/openid-configuration"
# Seconds of clock difference between the signer and verifiers tolerated on retirement.
CLOCK_MARGIN = 60.0
# Seconds between a node's checks for a rotation due and keys past their life.
CHECK_INTERVAL = 60.0
# Verifiers may cache the JWKS this long at most, and never past half the pending period.
_MAX_CACHE_SECONDS = 300
_TRUST_DOMAIN = re.compile(r"^[a-z0-9._-]+$")

KeyState = Literal["pending", "signing", "retiring"]


@dataclass(frozen=True)
class IdentitySettings:
    issuer: str
    trust_domain: str
    token_ttl: int
    rotation_period: float
    publish_ahead: float

    @classmethod
    def of(cls, cfg: Config) -> IdentitySettings:
        """From `[identity]`; ConfigError for values that cannot work."""
        given = cfg.identity
        issuer = given.issuer.rstrip("/")
        if not issuer:
            domain = cfg.server.domain
            issuer = f"https://api.{domain}" if domain else cfg.advertise_url.rstrip("/")
            if not domain and cfg.server.role != "all":
                log.warning(
                    "identity.issuer is unset: this process's address %s stands in,"
                    " but a cluster needs one issuer (the control URL)",
                    issuer,
                )
        parts = urlsplit(issuer)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"identity.issuer {issuer!r}: an http(s) URL")
        trust_domain = (given.trust_domain or parts.hostname).lower()
        if not _TRUST_DOMAIN.match(trust_domain):
            raise ConfigError(f"identity.trust_domain {trust_domain!r}: a-z, 0-9, '.', '-', '_'")
        if not 10 <= given.token_ttl <= 86400:
            raise ConfigError("identity.token_ttl: 10 to 86400 seconds")
        if given.publish_ahead < 0 or given.rotation_period < 0:
            raise ConfigError("identity.publish_ahead and rotation_period cannot be negative")
        if 0 < given.rotation_period <= given.publish_ahead:
            raise ConfigError("identity.rotation_period must be longer than publish_ahead")
        return cls(
            issuer, trust_domain, given.token_ttl, given.rotation_period, given.publish_ahead
        )

    @property
    def jwks_max_age(self) -> int:
        """Seconds verifiers may cache the JWKS: a new key reaches them before it signs."""
        return int(min(_MAX_CACHE_SECONDS, self.publish_ahead / 2))

    def discovery(self) -> dict[str, Any]:
        """The OIDC discovery document."""
        return {
            "issuer": self.issuer,
            "jwks_uri": self.issuer + JWKS_PATH,
            "id_token_signing_alg_values_supported": [ALGORITHM],
            "subject_types_supported": ["public"],
            "response_types_supported": ["id_token"],
            "claims_supported": [
                "iss", "sub", "aud", "iat", "exp", "jti", "sandbox_id", "template_id", "team_id",
            ],
        }  # fmt: skip


def signing_key(keys: list[SigningKeyRecord], now: float) -> SigningKeyRecord | None:
    """The key that signs at `now`: the newest generation already active."""
    active = [k for k in keys if k.active_at <= now]
    return active[-1] if active else None


def retired_at(keys: list[SigningKeyRecord], key: SigningKeyRecord) -> float | None:
    """When `key` stops signing: when the next generation becomes active."""
    later = [k.active_at for k in keys if k.generation > key.generation]
    return min(later) if later else None


def published(keys: list[SigningKeyRecord], now: float, ttl: int) -> list[SigningKeyRecord]:
    """The keys in the JWKS at `now`: all but those whose last token has expired."""
    kept = []
    for key in keys:
        retired = retired_at(keys, key)
        if retired is None or now < retired + ttl + CLOCK_MARGIN:
            kept.append(key)
    return kept


def key_state(keys: list[SigningKeyRecord], key: SigningKeyRecord, now: float) -> KeyState:
    """pending, signing or retiring."""
    if now < key.active_at:
        return "pending"
    return "signing" if signing_key(keys, now) == key else "retiring"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_jwk(private: ec.EllipticCurvePrivateKey) -> dict[str, str]:
    numbers = private.public_key().public_numbers()
    jwk = {
        "crv": "P-256",
        "kty": "EC",
        "x": _b64(numbers.x.to_bytes(32, "big")),
        "y": _b64(numbers.y.to_bytes(32, "big")),
    }
    # RFC 7638's thumbprint: the same key always has the same id.
    thumbprint = hashlib.sha256(json.dumps(jwk, separators=(",", ":")).encode()).digest()
    return {**jwk, "kid": _b64(thumbprint), "alg": ALGORITHM, "use": "sig"}


def _sign(private: ec.EllipticCurvePrivateKey, kid: str, claims: dict[str, Any]) -> str:
    header = {"alg": ALGORITHM, "kid": kid, "typ": "JWT"}
    signed = ".".join(
        _b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    r, s = decode_dss_signature(private.sign(signed.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signed}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _context(kid: str) -> str:
    return f"signing key {kid}"


@dataclass(frozen=True)
class MintedToken:
    token: str
    expires_at: float


class PublicKeys:
    """What verifiers see (discovery, JWKS): the control plane serves it from the store
    alone, without the server key."""

    def __init__(
        self,
        store: SigningKeyStore,
        settings: IdentitySettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    async def jwks(self) -> dict[str, Any]:
        keys = published(await self.store.list(), self.clock(), self.settings.token_ttl)
        return {"keys": [key.public_jwk for key in keys]}


class WorkloadIdentity(PublicKeys):
    """Mints tokens for sandboxes and keeps the signing keys (creation, rotation, removal)."""

    def __init__(
        self,
        store: SigningKeyStore,
        sealer: Sealer,
        settings: IdentitySettings,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(store, settings, clock)
        self._sealer = sealer
        self._private: dict[str, ec.EllipticCurvePrivateKey] = {}

    async def mint(self, record: SandboxRecord, name: str) -> MintedToken:
        """A token `name` of the sandbox's `iam.tokens`, signed now (KeyError: none such)."""
        definition = record.iam.get("tokens", {})[name]
        now = self.clock()
        keys = await self.store.list()
        # None before any key exists, or while the only key's creator's clock runs ahead.
        key = signing_key(keys, now) or (keys[0] if keys else await self._first_key(now))
        issued = int(now)
        claims = {
            "iss": self.settings.issuer,
            "sub": f"spiffe://{self.settings.trust_domain}/sandbox/{record.sandbox_id}",
            "aud": definition["audience"],
            "iat": issued,
            "exp": issued + self.settings.token_ttl,
            "jti": uuid.uuid4().hex,
            "sandbox_id": record.sandbox_id,
            "template_id": record.template_id,
            "team_id": TEAM_ID,
        }
        return MintedToken(_sign(self._private_key(key), key.kid, claims), claims["exp"])

    def _private_key(self, key: SigningKeyRecord) -> ec.EllipticCurvePrivateKey:
        private = self._private.get(key.kid)
        if private is None:
            der = self._sealer.open(key.private_key, _context(key.kid))
            loaded = serialization.load_der_private_key(der, password=None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            private = self._private[key.kid] = loaded
        return private

    async def keys(self) -> list[tuple[SigningKeyRecord, KeyState]]:
        """Every published key with its state (pending, signing, retiring)."""
        keys = await self.store.list()
        now = self.clock()
        return [(k, key_state(keys, k, now)) for k in published(keys, now, self.settings.token_ttl)]

    async def rotate(self) -> SigningKeyRecord:
        """A new key, published now, signing after `identity.publish_ahead`."""
        new = await self._add(await self.store.list(), self.clock())
        if new is None:
            raise Conflict("another rotation was under way at the same moment: list the keys")
        log.info("identity: key %s signs from %s", new.kid, time.ctime(new.active_at))
        return new

    async def maintain(self) -> None:
        """Make the first key, rotate when the period is over, remove keys past their life."""
        now = self.clock()
        keys = await self.store.list()
        if not keys:
            await self._first_key(now)
            return
        period = self.settings.rotation_period
        if period and now >= keys[-1].active_at + period - self.settings.publish_ahead:
            await self._add(keys, now)
            keys = await self.store.list()
        gone = {k.kid for k in keys} - {
            k.kid for k in published(keys, now, self.settings.token_ttl)
        }
        if gone:
            await self.store.remove(sorted(gone))
            for kid in gone:
                self._private.pop(kid, None)

    async def run_every(self, interval: float = CHECK_INTERVAL) -> None:
        while True:
            try:
                await self.maintain()
            except Exception:  # the state store down: the next round tries again
                log.exception("identity: keeping the signing keys failed")
            await asyncio.sleep(interval)

    async def reseal(self) -> int:
        """Move keys sealed with a former server key to the current one; how many moved."""
        moved = 0
        for key in await self.store.list():
            new = self._sealer.reseal(key.private_key, _context(key.kid))
            if new is not None and await self.store.reseal(key.kid, key.private_key, new):
                moved += 1
        return moved

    async def _first_key(self, now: float) -> SigningKeyRecord:
        """The first key signs at once: no verifier can have cached a JWKS before it."""
        await self._add([], now)
        # Ours, or another process's made at the same moment.
        return (await self.store.list())[0]

    async def _add(self, keys: list[SigningKeyRecord], now: float) -> SigningKeyRecord | None:
        """A key of the next generation (None: another process made that generation)."""
        private = ec.generate_private_key(ec.SECP256R1())
        jwk = _public_jwk(private)
        der = private.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        active_at = now
        if keys:
            active_at = max(now + self.settings.publish_ahead, keys[-1].active_at)
        record = SigningKeyRecord(
            kid=jwk["kid"],
            generation=keys[-1].generation + 1 if keys else 1,
            algorithm=ALGORITHM,
            public_jwk=jwk,
            created_at=now,
            active_at=active_at,
            private_key=self._sealer.seal(der, _context(jwk["kid"])),
        )
        if not await self.store.add(record):
            return None
        self._private[record.kid] = private
        return record
