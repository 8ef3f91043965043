"""A small, synchronous OCI distribution client: resolve an image, fetch verified blobs.

Layers, bottom to top: httpx's transport; `RetryTransport` (connection errors, 429/5xx);
`RegistryAuth` per request (anonymous, Basic, Bearer). Above that, each request tries the
configured mirrors of a registry first and the registry itself last. Callers in async code run
it in a thread; one client may serve several threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx

from .blobs import Progress, Verifier, write_verified
from .manifest import (
    MANIFEST_ACCEPT,
    Descriptor,
    ImageConfig,
    parse_config,
    parse_manifest,
    select_platform,
)
from .reference import ImageRef, parse_reference
from .registry_auth import (
    AuthSession,
    Credentials,
    CredentialStore,
    RegistryAuth,
    default_docker_config,
)
from .registry_errors import (
    DigestMismatch,
    RegistryError,
    RegistryUnreachable,
    error_from_response,
)
from .registry_transport import RetryPolicy, RetryTransport, base_url

__all__ = ["DEFAULT_PLATFORM", "RegistryClient", "ResolvedImage"]

log = logging.getLogger(__name__)

DEFAULT_PLATFORM = "linux/amd64"
USER_AGENT = "agentenv/0.1"
# Manifests and configs are read into memory; real ones are a few KiB, so cap them.
MAX_MANIFEST_BYTES = 4 << 20
MAX_CONFIG_BYTES = 8 << 20
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=10.0)

T = TypeVar("T")


@dataclass(frozen=True)
class ResolvedImage:
    """One platform's image: its manifest digest, config, and layers bottom to top."""

    ref: ImageRef
    digest: str
    media_type: str
    platform: str
    config_descriptor: Descriptor
    config: ImageConfig
    layers: tuple[Descriptor, ...]
    index_digest: str | None = None
    raw_manifest: bytes = field(default=b"", repr=False, compare=False)
    raw_config: bytes = field(default=b"", repr=False, compare=False)

    @property
    def diff_ids(self) -> tuple[str, ...]:
        """sha256 of each layer's uncompressed tar, in layer order."""
        return self.config.diff_ids

    @property
    def pinned(self) -> ImageRef:
        """The reference pinned to this platform's manifest digest."""
        return self.ref.with_digest(self.digest)


@dataclass(frozen=True)
class _Endpoint:
    """Where one attempt goes: a mirror or the registry itself."""

    base_url: str
    host: str
    is_mirror: bool


class RegistryClient:
    """Pulls manifests, configs and blobs from OCI registries; see the module docstring."""

    def __init__(
        self,
        *,
        credentials: Mapping[str, Credentials | tuple[str, str]] | None = None,
        docker_config: Path | None = None,
        use_docker_config: bool = True,
        insecure_registries: Iterable[str] = (),
        mirrors: Mapping[str, Iterable[str]] | None = None,
        retry: RetryPolicy | None = None,
        platform: str = DEFAULT_PLATFORM,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        config_path = (docker_config or default_docker_config()) if use_docker_config else None
        self._creds = CredentialStore(credentials, config_path)
        self._insecure = frozenset(h.lower() for h in insecure_registries)
        self._mirrors = {
            k.lower(): tuple(u.rstrip("/") for u in v) for k, v in (mirrors or {}).items()
        }
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        self.platform = platform
        inner = transport or httpx.HTTPTransport()
        self._http = httpx.Client(
            transport=RetryTransport(inner, self._retry, sleep),
            timeout=timeout,
            follow_redirects=True,
            # Digests cover the bytes as stored; ask proxies not to re-encode them.
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        )
        self._sessions: dict[tuple[str, str], AuthSession] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API -------------------------------------------------------------------------

    def resolve(self, ref: ImageRef | str) -> ResolvedImage:
        """Fetch the manifest (choosing our platform from an index) and the image config."""
        ref = parse_reference(ref) if isinstance(ref, str) else ref
        body, content_type = self._get_manifest(ref, ref.reference, ref.digest)
        manifest = parse_manifest(body, content_type)
        digest = _digest_of(body, ref.digest)
        index_digest = None
        if manifest.is_index:
            entry = select_platform(manifest, self.platform, str(ref))
            index_digest = digest
            body, content_type = self._get_manifest(ref, entry.digest, entry.digest)
            manifest = parse_manifest(body, content_type or entry.media_type)
            if manifest.is_index:
                raise RegistryError(
                    status=502, method="GET", url=str(ref), message="nested image index"
                )
            digest = entry.digest
        assert manifest.config is not None
        raw_config = self._get_small_blob(ref, manifest.config, MAX_CONFIG_BYTES)
        config = parse_config(raw_config)
        if len(config.diff_ids) != len(manifest.layers):
            raise RegistryError(
                status=502,
                method="GET",
                url=str(ref),
                message=f"config lists {len(config.diff_ids)} diff_ids for "
                f"{len(manifest.layers)} layers",
            )
        return ResolvedImage(
            ref=ref,
            digest=digest,
            media_type=manifest.media_type,
            platform=self.platform,
            config_descriptor=manifest.config,
            config=config,
            layers=manifest.layers,
            index_digest=index_digest,
            raw_manifest=body,
            raw_config=raw_config,
        )

    def fetch_blob(
        self,
        ref: ImageRef | str,
        descriptor: Descriptor,
        dest: Path,
        progress: Progress | None = None,
    ) -> Path:
        """Download a blob to `dest` atomically, checking size and digest while it streams."""
        ref = parse_reference(ref) if isinstance(ref, str) else ref

        def attempt(ep: _Endpoint) -> Path:
            # Transport retries cover the request; a body cut off midway restarts the download.
            delays = list(self._retry.delays())
            for i in range(len(delays) + 1):
                try:
                    with self._open(ep, ref.repository, f"blobs/{descriptor.digest}") as resp:
                        return write_verified(resp.iter_bytes(), descriptor, dest, progress)
                except httpx.TransportError:
                    if i == len(delays):
                        raise
                    self._sleep(delays[i])
            raise AssertionError("unreachable")

        return self._on_endpoints(ref, attempt)

    # -- internals ----------------------------------------------------------------------------

    def _get_manifest(self, ref: ImageRef, reference: str, digest: str | None) -> tuple[bytes, str]:
        """Body and Content-Type of a manifest; checked against `digest` when pinned."""

        def attempt(ep: _Endpoint) -> tuple[bytes, str]:
            headers = {"Accept": MANIFEST_ACCEPT}
            with self._open(ep, ref.repository, f"manifests/{reference}", headers) as resp:
                body = _read_capped(resp, MAX_MANIFEST_BYTES, "manifest")
                if digest is not None:
                    actual = _digest_of(body, digest)
                    if actual != digest:
                        raise DigestMismatch(f"manifest of {ref}", digest, actual)
                return body, resp.headers.get("Content-Type", "")

        return self._on_endpoints(ref, attempt)

    def _get_small_blob(self, ref: ImageRef, descriptor: Descriptor, cap: int) -> bytes:
        """A blob read into memory (the config), verified while read."""
        if descriptor.size > cap:
            raise RegistryError(
                status=502,
                method="GET",
                url=str(ref),
                message=f"blob {descriptor.digest} is {descriptor.size} bytes (limit {cap})",
            )

        def attempt(ep: _Endpoint) -> bytes:
            verifier = Verifier(descriptor.digest, descriptor.size, "config")
            parts = []
            with self._open(ep, ref.repository, f"blobs/{descriptor.digest}") as resp:
                for chunk in resp.iter_bytes():
                    verifier.update(chunk)
                    parts.append(chunk)
            verifier.finish()
            return b"".join(parts)

        return self._on_endpoints(ref, attempt)

    def _on_endpoints(self, ref: ImageRef, op: Callable[[_Endpoint], T]) -> T:
        """Run `op` on each mirror, then the registry; the registry's failure is final."""
        endpoints = self._endpoints(ref)
        for ep in endpoints[:-1]:
            try:
                return op(ep)
            except (RegistryError, DigestMismatch, httpx.HTTPError) as exc:
                log.warning("mirror %s failed for %s (%s); trying the next", ep.base_url, ref, exc)
        origin = endpoints[-1]
        try:
            return op(origin)
        except httpx.TransportError as exc:
            raise RegistryUnreachable(origin.host, exc) from exc

    def _endpoints(self, ref: ImageRef) -> list[_Endpoint]:
        mirrors = self._mirrors.get(ref.registry) or self._mirrors.get(ref.api_host.lower()) or ()
        eps = [_Endpoint(url, urlsplit(url).netloc, True) for url in mirrors]
        eps.append(_Endpoint(base_url(ref.api_host, self._insecure), ref.api_host, False))
        return eps

    @contextlib.contextmanager
    def _open(
        self,
        ep: _Endpoint,
        repository: str,
        path: str,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[httpx.Response]:
        """GET `/v2/<repository>/<path>` with auth; a streaming response, or RegistryError."""
        credentials = self._creds.lookup(ep.host)
        with self._lock:
            session = self._sessions.setdefault((ep.host, repository), AuthSession())
        auth = RegistryAuth(ep.host, repository, credentials, session, USER_AGENT)
        request = self._http.build_request(
            "GET", f"{ep.base_url}/v2/{repository}/{path}", headers=headers
        )
        response = self._http.send(request, auth=auth, stream=True)
        if not response.is_success:
            raise error_from_response(
                response, registry=ep.host, authenticated=credentials is not None
            )
        try:
            yield response
        finally:
            response.close()


def _read_capped(response: httpx.Response, cap: int, what: str) -> bytes:
    parts, total = [], 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > cap:
            raise RegistryError(
                status=502,
                method=response.request.method,
                url=str(response.request.url),
                message=f"{what} larger than {cap} bytes",
            )
        parts.append(chunk)
    return b"".join(parts)


def _digest_of(body: bytes, like: str | None) -> str:
    """Digest of `body` with the algorithm of `like` (sha256 when not pinned)."""
    algorithm = like.partition(":")[0] if like else "sha256"
    return f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}"
