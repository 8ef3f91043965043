"""HTTP clients: `ApiClient` for the control plane, `EnvdClient` for a sandbox's agent."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Generator, Iterator
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

import httpx

from agentenv.guest.rpc import ConnectError, encode_envelope, error_from_json, iter_messages
from agentenv.wire import (
    ACCESS_TOKEN_HEADER,
    API_KEY_HEADER,
    ENVD_FILES_ROUTE,
    ENVD_HEALTH_ROUTE,
    ENVD_PORT,
    SANDBOX_ID_HEADER,
    SANDBOX_PORT_HEADER,
)

STREAM_CONTENT_TYPE = "application/connect+json"
_CHUNK = 256 * 1024


def _user_agent() -> str:
    try:
        return f"aenv/{importlib_metadata.version('agentenv')}"
    except importlib_metadata.PackageNotFoundError:
        return "aenv"


class ApiError(Exception):
    """The server answered with an error status; `message` is what to show the user."""

    def __init__(self, status: int, message: str, *, has_code: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        # False when the body is not our `{code, message}` shape (e.g. a route that is missing).
        self.has_code = has_code

    @classmethod
    def from_response(cls, resp: httpx.Response) -> ApiError:
        try:
            data = resp.json()
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("message"):
            return cls(resp.status_code, str(data["message"]), has_code="code" in data)
        if isinstance(data, dict) and data.get("detail"):
            return cls(resp.status_code, str(data["detail"]), has_code=False)
        text = resp.text.strip()[:500] or resp.reason_phrase or "error"
        return cls(resp.status_code, f"HTTP {resp.status_code}: {text}", has_code=False)


class ServerUnreachable(Exception):
    """No connection could be made to the server."""

    def __init__(self, url: str, cause: Exception) -> None:
        super().__init__(f"cannot connect to {url} ({cause}): is the server running? make run")
        self.url = url


class _Base:
    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        transport: httpx.BaseTransport | None,
        timeout: httpx.Timeout,
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"User-Agent": _user_agent(), **headers},
            transport=transport,
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            return self._http.send(request, stream=stream)
        except httpx.ConnectError as exc:
            raise ServerUnreachable(self.url, exc) from exc


class ApiClient(_Base):
    """Control-plane calls (`/sandboxes`, `/v2/sandboxes`, `/health`)."""

    def __init__(
        self, url: str, key: str = "", *, transport: httpx.BaseTransport | None = None
    ) -> None:
        headers = {API_KEY_HEADER: key} if key else {}
        super().__init__(url, headers, transport, httpx.Timeout(120.0, connect=5.0))

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        resp = self._send(self._http.build_request(method, path, **kwargs))
        if resp.status_code >= 400:
            raise ApiError.from_response(resp)
        return resp

    def call_json(self, method: str, path: str) -> Any:
        """A call without a body; its JSON answer (None when it has none)."""
        resp = self._call(method, path)
        return resp.json() if resp.content else None

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """A POST with a JSON body; its JSON answer (None when it has none)."""
        resp = self._call("POST", path, json=body)
        return resp.json() if resp.content else None

    def list_templates(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v2/templates").json()

    def delete_template(self, template_id: str) -> None:
        self._call("DELETE", f"/templates/{template_id}")

    def pull(self, image: str, name: str | None) -> Iterator[dict[str, Any]]:
        """`POST /templates/pull`: yields each NDJSON progress event as it arrives."""
        body: dict[str, Any] = {"image": image}
        if name:
            body["name"] = name
        request = self._http.build_request(
            "POST", "/templates/pull", json=body, timeout=httpx.Timeout(30.0, read=None)
        )
        resp = self._send(request, stream=True)
        try:
            if resp.status_code >= 400:
                resp.read()
                raise ApiError.from_response(resp)
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.close()

    def create_sandbox(self, body: dict[str, Any]) -> dict[str, Any]:
        """`POST /sandboxes` (falls back to `/v2/sandboxes` if the route is missing)."""
        timeout = httpx.Timeout(600.0, connect=5.0)  # boots a VM; slow under TCG
        try:
            return self._call("POST", "/sandboxes", json=body, timeout=timeout).json()
        except ApiError as exc:
            if exc.status not in (404, 405) or exc.has_code:
                raise
        return self._call("POST", "/v2/sandboxes", json=body, timeout=timeout).json()

    def list_sandboxes(
        self, states: list[str] | None = None, metadata: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """All pages of `GET /v2/sandboxes`, following `x-next-token`."""
        params: dict[str, str] = {}
        if states:
            params["state"] = ",".join(states)
        if metadata:
            # Same encoding as the E2B SDK: quote keys and values, then urlencode the pairs.
            params["metadata"] = urlencode({quote(k): quote(v) for k, v in metadata.items()})
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        while True:
            resp = self._call("GET", "/v2/sandboxes", params=params)
            page = resp.json()
            if not isinstance(page, list):
                raise ApiError(resp.status_code, "unexpected response to GET /v2/sandboxes")
            items.extend(page)
            token = resp.headers.get("x-next-token", "")
            if not token or token in seen:
                return items
            seen.add(token)
            params["nextToken"] = token

    def get_sandbox(self, sandbox_id: str) -> dict[str, Any]:
        return self._call("GET", f"/sandboxes/{quote(sandbox_id, safe='')}").json()

    def kill_sandbox(self, sandbox_id: str) -> None:
        self._call("DELETE", f"/sandboxes/{quote(sandbox_id, safe='')}")

    def pause_sandbox(self, sandbox_id: str, memory: bool = True) -> None:
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/pause"
        self._call("POST", path, json={"memory": memory})

    def resume_sandbox(self, sandbox_id: str, timeout: int | None, memory: bool = True) -> bool:
        """Connect to a sandbox, resuming it if paused; True if it was paused."""
        body: dict[str, Any] = {"memory": memory}
        if timeout is not None:
            body["timeout"] = timeout
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/connect"
        response = self._call("POST", path, json=body)
        return response.status_code == 201

    def fork_sandbox(
        self, sandbox_id: str, count: int, timeout: int | None
    ) -> list[dict[str, Any]]:
        """`POST /sandboxes/{id}/fork`: one `{sandbox}` or `{error}` per fork."""
        body: dict[str, Any] = {"count": count}
        if timeout is not None:
            body["timeout"] = timeout
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/fork"
        return self._call("POST", path, json=body, timeout=httpx.Timeout(600.0, connect=5.0)).json()

    def create_snapshot(self, sandbox_id: str, name: str | None, memory: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"memory": memory}
        if name:
            body["name"] = name
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/snapshots"
        return self._call("POST", path, json=body, timeout=httpx.Timeout(600.0, connect=5.0)).json()

    def list_snapshots(self, sandbox_id: str | None, name: str | None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("sandboxID", sandbox_id), ("name", name)) if v}
        items: list[dict[str, Any]] = []
        while True:
            response = self._call("GET", "/snapshots", params=params)
            items += response.json()
            token = response.headers.get("x-next-token")
            if not token:
                return items
            params["nextToken"] = token

    def rollback(self, sandbox_id: str, snapshot_id: str) -> dict[str, Any]:
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/rollback"
        timeout = httpx.Timeout(600.0, connect=5.0)
        return self._call("POST", path, json={"snapshotID": snapshot_id}, timeout=timeout).json()

    def collect_garbage(self, grace: float | None) -> dict[str, Any]:
        body = {} if grace is None else {"graceSeconds": grace}
        return self._call(
            "POST", "/gc", json=body, timeout=httpx.Timeout(900.0, connect=5.0)
        ).json()

    def balloon(self, sandbox_id: str) -> dict[str, Any]:
        return self._call("GET", f"/sandboxes/{quote(sandbox_id, safe='')}/balloon").json()

    def set_balloon(self, sandbox_id: str, target_mb: int) -> None:
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/balloon"
        self._call("PUT", path, json={"targetMB": target_mb})

    def set_timeout(self, sandbox_id: str, seconds: int) -> None:
        self._call(
            "POST", f"/sandboxes/{quote(sandbox_id, safe='')}/timeout", json={"timeout": seconds}
        )

    def refresh(self, sandbox_id: str, duration: int) -> None:
        """Keep-alive: extend the expiry to at least now + `duration` (never shortens)."""
        path = f"/sandboxes/{quote(sandbox_id, safe='')}/refreshes"
        self._call("POST", path, json={"duration": duration})

    def health(self) -> httpx.Response:
        """`GET /health` without raising on error statuses."""
        return self._send(self._http.build_request("GET", ENVD_HEALTH_ROUTE, timeout=5.0))


class EnvdClient(_Base):
    """Calls to a sandbox's envd, routed by the server's proxy through `E2b-Sandbox-*` headers."""

    def __init__(
        self,
        url: str,
        sandbox_id: str,
        access_token: str | None = None,
        *,
        user: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {SANDBOX_ID_HEADER: sandbox_id, SANDBOX_PORT_HEADER: str(ENVD_PORT)}
        if access_token:
            headers[ACCESS_TOKEN_HEADER] = access_token
        if user:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
        super().__init__(url, headers, transport, httpx.Timeout(60.0, connect=5.0))
        self.sandbox_id = sandbox_id
        self._args = (url, sandbox_id, access_token, user, transport)

    def clone(self) -> EnvdClient:
        """A separate client (own connection pool) for the same sandbox, e.g. for another thread."""
        url, sandbox_id, token, user, transport = self._args
        return EnvdClient(url, sandbox_id, token, user=user, transport=transport)

    def stream(
        self, method: str, message: dict[str, Any], timeout: float | None = None
    ) -> Generator[dict[str, Any], None, None]:
        """Server-streaming RPC: yield each response message as it arrives."""
        headers = {
            "Content-Type": STREAM_CONTENT_TYPE,
            "Connect-Protocol-Version": "1",
            "Connect-Content-Encoding": "identity",
            "Connect-Accept-Encoding": "identity",
            "Keepalive-Ping-Interval": "50",
        }
        read_timeout = None
        if timeout:
            headers["Connect-Timeout-Ms"] = str(int(timeout * 1000))
            read_timeout = timeout + 30.0
        request = self._http.build_request(
            "POST",
            f"/{method}",
            content=encode_envelope(message),
            headers=headers,
            timeout=httpx.Timeout(30.0, connect=5.0, read=read_timeout),
        )
        resp = self._send(request, stream=True)
        try:
            if resp.status_code != 200:
                resp.read()
                raise _rpc_error(resp)
            ctype = resp.headers.get("content-type", "")
            if not ctype.startswith(STREAM_CONTENT_TYPE):
                resp.read()
                raise ConnectError("internal", f"unexpected content-type {ctype!r} from {method}")
            yield from iter_messages(resp.iter_bytes())
        finally:
            resp.close()

    def unary(self, method: str, message: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """Unary RPC with the JSON codec."""
        resp = self._send(
            self._http.build_request(
                "POST",
                f"/{method}",
                json=message,
                headers={
                    "Connect-Protocol-Version": "1",
                    "Connect-Timeout-Ms": str(int(timeout * 1000)),
                },
                timeout=timeout + 5.0,
            )
        )
        if resp.status_code != 200:
            raise _rpc_error(resp)
        return resp.json() if resp.content else {}

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll envd's `/health` through the proxy until it answers 2xx or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                resp = self._send(self._http.build_request("GET", ENVD_HEALTH_ROUTE, timeout=5.0))
                if resp.is_success:
                    return
                problem = ApiError.from_response(resp).message
            except httpx.TransportError as exc:
                problem = str(exc)
            if time.monotonic() >= deadline:
                raise ApiError(503, f"sandbox agent not ready after {timeout:.0f}s: {problem}")
            time.sleep(0.5)

    def upload(self, local: Path, remote: str) -> list[dict[str, Any]]:
        """`POST /files?path=REMOTE`, streaming the local file as the raw body."""
        size = local.stat().st_size

        def chunks() -> Iterator[bytes]:
            with local.open("rb") as fh:
                while block := fh.read(_CHUNK):
                    yield block

        request = self._http.build_request(
            "POST",
            ENVD_FILES_ROUTE,
            params={"path": remote},
            content=chunks(),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            timeout=httpx.Timeout(300.0, connect=5.0),
        )
        resp = self._send(request)
        if not resp.is_success:
            raise ApiError.from_response(resp)
        try:
            entries = resp.json()
        except ValueError:
            return []
        return entries if isinstance(entries, list) else []

    def download(self, remote: str, local: Path) -> int:
        """`GET /files?path=REMOTE` streamed into `local` (written atomically); returns bytes."""
        request = self._http.build_request(
            "GET",
            ENVD_FILES_ROUTE,
            params={"path": remote},
            timeout=httpx.Timeout(300.0, connect=5.0),
        )
        resp = self._send(request, stream=True)
        try:
            if not resp.is_success:
                resp.read()
                raise ApiError.from_response(resp)
            tmp = local.with_name(f".{local.name}.{os.getpid()}.part")
            total = 0
            try:
                with tmp.open("wb") as fh:
                    for block in resp.iter_bytes(_CHUNK):
                        fh.write(block)
                        total += len(block)
                tmp.replace(local)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return total
        finally:
            resp.close()


def _rpc_error(resp: httpx.Response) -> ConnectError:
    try:
        data = resp.json()
    except ValueError:
        data = resp.text.strip() or resp.reason_phrase
    return error_from_json(data, resp.status_code)
