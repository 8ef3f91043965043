"""Shared fixtures: the guest kit (built once per machine) and a live server."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.cluster.postgres import LocalPostgres
from agentenv.config import load_config

from .live import LiveServer, checked_server
from .s3server import new_bucket, s3_server
from .vmfactory import VmFactory

# pytest itself names the running test here, in every phase.
_PYTEST_OWN = {"PYTEST_CURRENT_TEST"}


def _environment_kept(what: str) -> Iterator[None]:
    before = dict(os.environ)
    yield
    names = (before.keys() | os.environ.keys()) - _PYTEST_OWN
    changed = sorted(name for name in names if before.get(name) != os.environ.get(name))
    # Put back, so the tests after this one run in the environment they expect.
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    assert not changed, f"{what} left the process environment changed: {changed}"


# The session fixture each of whose users' modules run on one worker: it is built once.
_SHARED_ONCE = "code_interpreter_server"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Work units for `--dist loadgroup`: a module each, as `loadfile` makes them (its
    fixtures stay with its tests), except that every module using the code interpreter's
    server is one unit: one worker builds it (minutes, gigabytes) instead of each."""
    sharing = {
        item.module.__name__
        for item in items
        if isinstance(item, pytest.Function) and _SHARED_ONCE in item.fixturenames
    }
    for item in items:
        module = item.module.__name__ if isinstance(item, pytest.Function) else item.nodeid
        group = _SHARED_ONCE if module in sharing else module
        item.add_marker(pytest.mark.xdist_group(group))


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Once a passing test's fixtures are torn down (its servers stopped), its `tmp_path`
    goes: VM disks and snapshots of a whole run would not fit CI's disk."""
    report = yield
    item.stash[_PASSED] = item.stash.get(_PASSED, True) and not report.failed
    path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "teardown" and item.stash[_PASSED] and path is not None:
        if not _mounts_under(path):
            shutil.rmtree(path, ignore_errors=True)
    return report


def _mounts_under(path: Path) -> list[str]:
    """Mount points inside `path`: removing through one would delete what it shows."""
    inside = f"{path}/"
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return [m.split()[1] for m in mounts if m.split()[1].startswith(inside)]


@pytest.fixture(autouse=True)
def _environment_kept_by_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test and its fixtures put back every variable they set (`monkeypatch.setenv`)."""
    yield from _environment_kept(request.node.nodeid)


@pytest.fixture(scope="module", autouse=True)
def _environment_kept_by_the_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """So do module-scoped fixtures (`pytest.MonkeyPatch.context()`), by the module's end."""
    yield from _environment_kept(request.node.nodeid)


@pytest.fixture(scope="session")
def kit_ready() -> None:
    """Build (or find cached) the kit and the base template the servers boot from."""
    from agentenv.guest.kit import build_kit
    from agentenv.images.base import build_base_template

    cfg = load_config()
    build_kit(cfg)
    build_base_template(cfg)


@pytest.fixture(scope="session")
def server(kit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the session; each test using it is checked by `vms`."""
    with checked_server(LiveServer(tmp_path_factory.mktemp("aenv-home"))) as live:
        yield live


@pytest.fixture
def vms() -> Iterator[VmFactory]:
    """The test's VM factory: what it made is killed after the test, and the host checked."""
    factory = VmFactory()
    yield factory
    factory.close()


@pytest.fixture(autouse=True)
def _shared_server_back_to_baseline(request: pytest.FixtureRequest, vms: VmFactory) -> None:
    """A test on the session's server leaves its host resources as it found them."""
    if "server" in request.fixturenames:
        vms.watch(request.getfixturevalue("server"))


@pytest.fixture
def fresh_server(kit_ready: None, tmp_path: Path, vms: VmFactory) -> LiveServer:
    """A server of one's own, for tests that restart it or change its configuration;
    closed after the test, and nothing of it may remain on the host."""
    live = LiveServer(tmp_path / "home")
    live.home.mkdir()
    return vms.own(live)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 server (moto) on a free loopback port, for the whole session."""
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    return new_bucket(s3_endpoint)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """Debian's PostgreSQL with a data directory of its own, for the whole session."""
    directory = Path(tempfile.mkdtemp(prefix="aenv-pg-", dir="/tmp"))
    server = LocalPostgres(directory)
    try:
        yield server.start()
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A new, empty database on the session's PostgreSQL."""
    name = "t" + secrets.token_hex(6)
    base = postgres_server.rsplit("/", 1)[0]
    subprocess.run(
        ["psql", f"{base}/postgres", "-c", f"CREATE DATABASE {name}"],
        check=True,
        capture_output=True,
    )
    return f"{base}/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every state-store case runs on both databases the store supports."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("postgres_url")
