"""Where the proxy sends each running sandbox's traffic: kept in memory, changed only by the
lifecycle (a route exists exactly while its sandbox runs), so a proxied request costs no
database read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...net.rules import EgressRules


class AgentLiveness:
    """When a sandbox's guest agent last answered through the proxy: a pause need not ask
    it again (under TCG a fresh request costs a pause some 30 ms)."""

    def __init__(self) -> None:
        self._answered_at = float("-inf")

    def answered(self) -> None:
        self._answered_at = time.monotonic()

    def answered_within(self, seconds: float) -> bool:
        return time.monotonic() - self._answered_at <= seconds


@dataclass(frozen=True)
class Route:
    """Where the proxy sends a sandbox's traffic, and the token it must check."""

    host: str
    access_token: str | None
    # Requests to its own ports (not the agent's) must carry it; None: they are public.
    traffic_token: str | None = None
    # The Host header its own ports see (`${PORT}` is the port); None: as sent.
    mask_host: str | None = None
    # Its egress rules: the egress proxy reads its allowed domains.
    egress: EgressRules = field(default_factory=EgressRules)
    # Its ports that serve HTTPS (E2B's `httpsPorts`): the proxy speaks TLS to them.
    https_ports: frozenset[int] = frozenset()
    agent: AgentLiveness = field(default_factory=AgentLiveness, compare=False)

    def scheme(self, port: int) -> str:
        """How the proxy speaks to the guest's `port`."""
        return "https" if port in self.https_ports else "http"


class RouteTable:
    """The routes of a node's running sandboxes, by sandbox id."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def get(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._routes

    def set(self, sandbox_id: str, route: Route) -> None:
        self._routes[sandbox_id] = route

    def drop(self, sandbox_id: str) -> None:
        self._routes.pop(sandbox_id, None)

    def items(self) -> list[tuple[str, Route]]:
        """Every running sandbox's route, as a list the caller may keep."""
        return list(self._routes.items())

    def egress_at(self, address: str) -> tuple[str, EgressRules] | None:
        """The id and egress rules of the running sandbox at namespace address `address`."""
        return next(
            ((sandbox_id, r.egress) for sandbox_id, r in self._routes.items() if r.host == address),
            None,
        )
