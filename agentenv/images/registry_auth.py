"""Registry auth as an httpx auth layer: anonymous, Basic, or a Bearer token from the challenge.

The handshake, per the distribution spec and Docker: send the request (with a cached
Authorization if we have one); on 401 read `WWW-Authenticate`. `Basic` means resend with
user:password. `Bearer realm=..,service=..,scope=..` means GET a token from the realm (with
Basic credentials if we know any, anonymous otherwise) and resend with it. A cached token that
expired answers 401 again, which runs the same exchange: that is the refresh.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from .registry_errors import RegistryError, error_from_response

__all__ = [
    "AuthSession",
    "Challenge",
    "CredentialStore",
    "Credentials",
    "RegistryAuth",
    "default_docker_config",
    "parse_challenge",
]

# Docker stores Hub credentials under its old v1 index URL.
_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io")
_PARAM = re.compile(r'([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


@dataclass(frozen=True)
class Credentials:
    """A username and password (or token used as password) for one registry."""

    username: str
    password: str = field(repr=False)

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


def default_docker_config() -> Path:
    """`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`, as the docker CLI reads."""
    base = os.environ.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


class CredentialStore:
    """Credentials by registry host: the explicit mapping first, then the docker config file."""

    def __init__(
        self,
        explicit: Mapping[str, Credentials | tuple[str, str]] | None = None,
        docker_config: Path | None = None,
    ) -> None:
        self._explicit = {_host_key(k): _as_credentials(v) for k, v in (explicit or {}).items()}
        self._docker_config = docker_config
        self._from_file: dict[str, Credentials] | None = None
        self._lock = threading.Lock()

    def lookup(self, host: str) -> Credentials | None:
        """Credentials for `host` (registry name or API host), or None for anonymous."""
        for key in _aliases(_host_key(host)):
            if key in self._explicit:
                return self._explicit[key]
        file_creds = self._load_file()
        for key in _aliases(_host_key(host)):
            if key in file_creds:
                return file_creds[key]
        return None

    def _load_file(self) -> dict[str, Credentials]:
        with self._lock:
            if self._from_file is None:
                self._from_file = _read_docker_config(self._docker_config)
            return self._from_file


def _read_docker_config(path: Path | None) -> dict[str, Credentials]:
    """Parse `auths` of a docker config; credsStore/credHelpers are not consulted."""
    if path is None or not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # a broken config must not stop anonymous pulls
    out: dict[str, Credentials] = {}
    auths = doc.get("auths") if isinstance(doc, dict) else None
    for key, entry in (auths or {}).items():
        if not isinstance(entry, dict):
            continue
        creds = None
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            creds = Credentials(user, password)
        elif entry.get("username"):
            creds = Credentials(str(entry["username"]), str(entry.get("password", "")))
        if creds is not None:
            out[_host_key(key)] = creds
    return out


def _as_credentials(value: Credentials | tuple[str, str]) -> Credentials:
    return value if isinstance(value, Credentials) else Credentials(*value)


def _host_key(text: str) -> str:
    """`https://index.docker.io/v1/` and `Index.Docker.io` both become `index.docker.io`."""
    text = text.strip()
    netloc = urlsplit(text).netloc if "://" in text else text.split("/", 1)[0]
    return netloc.lower()


def _aliases(host: str) -> tuple[str, ...]:
    return _HUB_KEYS if host in _HUB_KEYS else (host,)


@dataclass(frozen=True)
class Challenge:
    """A parsed `WWW-Authenticate` header: scheme (lowercase) and its parameters."""

    scheme: str
    params: Mapping[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """Parse `Bearer realm="...",service="...",scope="..."` or `Basic realm="..."`."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params = {
        m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)).replace(
            '\\"', '"'
        )
        for m in _PARAM.finditer(rest)
    }
    return Challenge(scheme.lower(), params)


@dataclass
class AuthSession:
    """The Authorization header we last earned for one (host, repository); shared by requests."""

    header: str | None = None


class RegistryAuth(httpx.Auth):
    """One request's auth flow for `host`/`repository`, reusing and refreshing `session`."""

    def __init__(
        self,
        host: str,
        repository: str,
        credentials: Credentials | None,
        session: AuthSession,
        user_agent: str,
    ) -> None:
        self.host = host
        self.scope = f"repository:{repository}:pull"
        self.credentials = credentials
        self.session = session
        self.user_agent = user_agent

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        sent = self.session.header
        if sent:
            request.headers["Authorization"] = sent
        response = yield request
        if response.status_code != 401:
            return
        challenge = parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if challenge is None:
            return
        if challenge.scheme == "basic":
            if self.credentials is None:
                return
            header = self.credentials.basic_header()
            if header == sent:
                return  # these credentials were just refused; asking again will not help
        elif challenge.scheme == "bearer":
            header = yield from self._fetch_token(challenge)
        else:
            return
        self.session.header = header
        request.headers["Authorization"] = header
        yield request

    def _fetch_token(self, challenge: Challenge) -> Generator[httpx.Request, httpx.Response, str]:
        """GET the realm for a token; raise RegistryAuthError if it refuses our credentials."""
        realm = challenge.params.get("realm")
        if not realm or urlsplit(realm).scheme not in ("http", "https"):
            raise RegistryError(
                status=401,
                method="GET",
                url=f"{self.host}/v2/",
                message=f"bearer challenge without a usable realm: {realm!r}",
            )
        params: list[tuple[str, str | int | float | bool | None]] = []
        if challenge.params.get("service"):
            params.append(("service", challenge.params["service"]))
        scopes = [self.scope]
        if challenge.params.get("scope") and challenge.params["scope"] != self.scope:
            scopes.insert(0, challenge.params["scope"])
        params.extend(("scope", s) for s in scopes)
        headers = {"User-Agent": self.user_agent, "Accept": "application/json"}
        if self.credentials is not None:
            headers["Authorization"] = self.credentials.basic_header()
        response = yield httpx.Request("GET", realm, params=params, headers=headers)
        response.read()
        if not response.is_success:
            raise error_from_response(
                response, registry=self.host, authenticated=self.credentials is not None
            )
        try:
            doc = response.json()
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(
                status=502,
                method="GET",
                url=realm,
                message="token endpoint answered without a token",
            )
        return f"Bearer {token}"
