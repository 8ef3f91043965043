"""The console's page and assets, as `console/build.mjs` left them in `assets/`: gzipped
when the browser takes it, under a policy that runs only our own scripts."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import RedirectResponse

from ..errors import NotFound, PermanentlyUnavailable

ASSETS = Path(__file__).parent / "assets"
PREFIX = "/console"
# Scripts and styles from this origin only (no inline script), calls to this origin only,
# no framing. Inline styles are the terminal's (xterm sizes its rows with a style element).
POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(?:js|css)$")


def _file(name: str, request: Request) -> Response:
    """`name` from the assets, gzipped when the request accepts it (both are built)."""
    path = ASSETS / name
    if not path.is_file():
        if not (ASSETS / "index.html").is_file():
            raise PermanentlyUnavailable("the console is not built: run `make console`")
        raise NotFound(f"no console asset {name!r}")
    headers = dict(SECURITY_HEADERS)
    headers["Vary"] = "Accept-Encoding"
    packed = path.with_name(name + ".gz")
    if "gzip" in request.headers.get("accept-encoding", "") and packed.is_file():
        headers["Content-Encoding"] = "gzip"
        path = packed
    return Response(path.read_bytes(), media_type=TYPES[Path(name).suffix], headers=headers)


def site_router() -> APIRouter:
    """GET /console (the page; a sign-in is the page's own) and its assets."""
    router = APIRouter(include_in_schema=False)

    @router.get(PREFIX)
    async def bare() -> Response:
        return RedirectResponse(PREFIX + "/", status_code=308)

    @router.get(PREFIX + "/")
    async def page(request: Request) -> Response:
        return _file("index.html", request)

    @router.get(PREFIX + "/assets/{name}")
    async def asset(request: Request, name: str) -> Response:
        if not _NAME.match(name):
            raise NotFound(f"no console asset {name!r}")
        return _file(name, request)

    return router
