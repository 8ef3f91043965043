"""Every route of the newest E2B SDK's generated client is served by a node (as its
`/openapi.json` says) and listed in `docs/e2b-compatibility.md`: the next SDK release's new
route fails here, not for users."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import e2b.api.client.api as sdk_api
import pytest

from agentenv.api.app import build_api
from agentenv.config import Config

DOCS = Path(__file__).parents[2] / "docs" / "e2b-compatibility.md"


def _shape(path: str) -> str:
    """A path with its parameters unnamed: `/sandboxes/{}/pause`."""
    return re.sub(r"\{[^}]*\}", "{}", path)


def _sdk_routes() -> set[tuple[str, str]]:
    routes = set()
    for package in pkgutil.iter_modules(sdk_api.__path__):
        group = importlib.import_module(f"{sdk_api.__name__}.{package.name}")
        for module in pkgutil.iter_modules(group.__path__):
            loaded = importlib.import_module(f"{group.__name__}.{module.name}")
            source = inspect.getsource(loaded._get_kwargs)
            method = re.search(r'"method": "(\w+)"', source)
            url = re.search(r'"url": f?"([^"]+)"', source)
            assert method and url, module.name
            routes.add((method.group(1).upper(), _shape(url.group(1))))
    return routes


SDK_ROUTES = sorted(_sdk_routes())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    cfg = Config()
    cfg.paths.home = str(tmp_path_factory.mktemp("home"))
    paths = build_api(cfg, "e2b_test").openapi()["paths"]
    return {(method.upper(), _shape(path)) for path, item in paths.items() for method in item}


@pytest.mark.parametrize(("method", "path"), SDK_ROUTES)
def test_the_sdks_route_is_served(method: str, path: str, served: set[tuple[str, str]]) -> None:
    assert (method, path) in served


def _documented() -> set[str]:
    """Every path written in backticks in the compatibility page, parameters unnamed."""
    spans = re.findall(r"`([^`]*)`", DOCS.read_text())
    return {_shape(word) for span in spans for word in span.split() if word.startswith("/")}


@pytest.mark.parametrize(("method", "path"), SDK_ROUTES)
def test_the_sdks_route_is_documented(method: str, path: str) -> None:
    assert path in _documented(), f"{method} {path} is not in {DOCS.name}"
