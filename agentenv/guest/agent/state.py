"""Agent-wide state shared by every handler: the rootfs, users and what ``/init`` set."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .connect import ConnectError
from .init_secret import SecretSource
from .rootfs import RootFS
from .users import User, UserDB, basic_auth_user


@dataclass
class AgentState:
    """What the agent knows; ``/init`` updates env vars, token and defaults."""

    rootfs: RootFS
    users: UserDB
    # Where the host's /init secret is read from, on each /init.
    init_secret: SecretSource
    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None
    default_user: str | None = None
    default_workdir: str | None = None
    # Running as a VM's agent: /init attaches the user's disk, sets the clock, seeds RNG.
    guest: bool = False

    @classmethod
    def create(cls, root: str, init_secret: SecretSource, guest: bool = False) -> AgentState:
        fs = RootFS(root)
        return cls(rootfs=fs, users=UserDB(fs.root), init_secret=init_secret, guest=guest)

    def resolve_user(self, name: str | None) -> User:
        """The named user, else the /init default, else ``user`` or root."""
        if not name:
            if self.default_user and (user := self.users.lookup(self.default_user)):
                return user
            return self.users.default_user()
        user = self.users.lookup(name)
        if user is None:
            # envd's words, which the SDKs and E2B's build errors pass on.
            raise ConnectError("unauthenticated", f"invalid username: '{name}'")
        return user

    def request_user(self, request: web.Request, param: str | None = None) -> User:
        """The user of a request: query ``param`` first, then Basic auth, then the default."""
        name = request.query.get(param) if param else None
        name = name or basic_auth_user(request.headers.get("Authorization"))
        return self.resolve_user(name)

    def token_ok(self, request: web.Request) -> bool:
        """True when no token is set or the request carries the right X-Access-Token."""
        if self.access_token is None:
            return True
        given = request.headers.get("X-Access-Token", "")
        return hmac.compare_digest(given.encode(), self.access_token.encode())


def app_key(name: str, kind: type) -> Any:
    """An application key: aiohttp >= 3.9 warns on plain strings, Debian's 3.8.4 has no AppKey."""
    return web.AppKey(name, kind) if hasattr(web, "AppKey") else name


STATE_KEY = app_key("aenv_state", AgentState)


def get_state(request: web.Request) -> AgentState:
    return request.app[STATE_KEY]
