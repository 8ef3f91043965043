"""Run E2B's own Python SDK test suite, unmodified, against a live AgentENV server.

Nothing of E2B is copied into this repository: the runner exports the SDK package from a
local git mirror of github.com/e2b-dev/E2B at a release tag, installs it (editable) with the
suite's test dependencies into a separate venv, and runs the suite's own `conftest.py` and
fixtures with pytest, pointed at a fresh server by the SDK's three variables only
(`E2B_API_URL`, `E2B_SANDBOX_URL`, `E2B_API_KEY`).

Usage (as root, from the project root, with the project venv; starts a server and VMs)::

    .venv/bin/python -m tests.conformance.e2b_suite \\
        [--repo /work/.mirror/e2b-dev+E2B/repo] [--tag @e2b/python-sdk@2.45.1] \\
        [--workdir /tmp/e2bsuite] [--paths tests/sync tests/async tests/shared] \\
        [-k EXPR] [--timeout 180] [--deadline 14:35] [--list-only] \\
        [--no-offline-pass | --offline-only | --reuse-offline]

- `--repo` is a (bare) git repository of E2B; `--tag` the SDK release whose tests run.
- `--workdir` keeps the exported source, the SDK venv, the local registry's storage,
  pytest's logs and JUnit XML, `server.log` and `results.json` (per-test outcome and
  reason, failure groups); the server's home is deleted after the run.
- `--deadline HH:MM` (UTC) interrupts pytest then and reports what finished; tests not
  reached are counted as `not_run`.
- `--list-only` collects and prints the selection and the exclusions, with no server.
- Offline pass (default): every selected test first runs with the SDK pointed at a loopback
  port that accepts and drops connections (a small pytest plugin written to the workdir
  counts them per test). Tests that pass or skip there without one connection never touch
  a server (mocks, payload and helper unit tests); their results are kept and only the rest
  run against the live server. `--no-offline-pass` runs everything against the server;
  `--offline-only` stops after the offline pass; `--reuse-offline` takes its saved results.

Images: the suite builds templates `FROM ubuntu:22.04` and from `e2bdev/base`. The server
maps `e2bdev/base` to its built-in `base`; `ubuntu:22.04` is served by a local registry
(`docker-registry`) that the server is given as its `docker.io` mirror
(`AENV_REGISTRY_MIRRORS`). The pushed image is one layer made from our own base rootfs (a
Debian tree), tagged `library/ubuntu:22.04`, so no image is pulled from Docker Hub.

Excluded (deselected, listed in the summary with the reason), because they would send
traffic to public addresses or need what a local server cannot give:

- every test in a `test_network.py` file: curls public sites and an `httpbin` template
  through E2B's wildcard sandbox hostnames;
- every test with "internet" in its id: checks that the sandbox can (or cannot) reach
  public websites;
- every test whose function calls `get_host(`: it opens `https://<port>-<id>.<domain>`
  sandbox URLs, which need E2B's wildcard DNS and TLS (and would go to public DNS);
- every test whose function asserts `"https://sandbox.e2b.app"`: mocked tests of the SDK's
  default sandbox address, which holds only without `E2B_SANDBOX_URL`, and a server
  without E2B's wildcard DNS must set it.

As a safety net the pytest process also gets `HTTP(S)_PROXY`/`ALL_PROXY` set to a closed
loopback port with `NO_PROXY=127.0.0.1,localhost`, so an HTTP client that honours the
environment cannot reach a public address by mistake.

At the end the runner prints the failing tests grouped by their first error line and one
JSON line: `{"tag", "selected", "passed", "failed", "errors", "skipped", "not_run",
"excluded", "excluded_reasons", "duration_s"}`.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

DEFAULT_REPO = Path("/work/.mirror/e2b-dev+E2B/repo")
DEFAULT_TAG = "@e2b/python-sdk@2.45.1"
DEFAULT_WORKDIR = Path("/tmp/e2bsuite")
DEFAULT_PATHS = ("tests/sync", "tests/async", "tests/shared")
SDK_SUBDIR = "packages/python-sdk"
# Test dependencies from the SDK's `dev` group; linters, type checkers and xdist are not needed.
TEST_DEPS = ("pytest", "pytest-asyncio", "pytest-timeout", "python-dotenv", "pytest-dotenv")
UBUNTU_REPOSITORY, UBUNTU_TAG = "library/ubuntu", "22.04"
DEAD_PROXY = "http://127.0.0.1:9"

REASON_NETWORK_FILE = "test_network.py: public websites and httpbin via wildcard sandbox hosts"
REASON_INTERNET = "'internet' test: checks reaching public websites from the sandbox"
REASON_GET_HOST = "uses get_host(): needs E2B wildcard DNS/TLS sandbox hostnames"
# A mocked test that asserts the SDK's default sandbox address, which only holds without
# E2B_SANDBOX_URL; a server without E2B's wildcard DNS must set that variable.
DEFAULT_SANDBOX_URL = '"https://sandbox.e2b.app"'
REASON_DEFAULT_URL = "asserts the SDK's default sandbox URL: needs running without E2B_SANDBOX_URL"


def log(message: str) -> None:
    print(f"[e2b-suite {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- source and venv -------------------------------------------------------------------


def export_sdk(repo: Path, tag: str, workdir: Path) -> Path:
    """`packages/python-sdk` at `tag`, exported once into the workdir."""
    dest = workdir / "src" / re.sub(r"[^A-Za-z0-9.]+", "_", tag).strip("_")
    sdk = dest / SDK_SUBDIR
    if not (sdk / "pyproject.toml").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", tag, SDK_SUBDIR], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        log(f"exported {SDK_SUBDIR} at {tag} to {dest}")
    return sdk


def ensure_venv(workdir: Path, sdk: Path) -> Path:
    """A separate venv with the SDK (editable) and the suite's pytest plugins."""
    venv = workdir / "venv"
    python = venv / "bin" / "python"
    stamp = venv / f".installed-{sdk.parent.parent.name}"
    if stamp.exists():
        return python
    if not python.exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    dev = tomllib.loads((sdk / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    wanted = [spec for spec in dev if re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0] in TEST_DEPS]
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", str(sdk), *wanted], check=True)
    stamp.touch()
    log(f"installed the SDK and {', '.join(wanted)} into {venv}")
    return python


# --- selection ---------------------------------------------------------------------------


def collect(python: Path, sdk: Path, paths: list[str], keyword: str | None) -> list[str]:
    args = [str(python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    if keyword:
        args += ["-k", keyword]
    done = subprocess.run([*args, *paths], cwd=sdk, capture_output=True, text=True, env=clean_env())
    ids = [line.strip() for line in done.stdout.splitlines() if "::" in line]
    if done.returncode not in (0, 5) or (not ids and done.returncode != 5):
        raise SystemExit(f"collection failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return ids


def functions_calling(path: Path, needle: str) -> set[str]:
    """Names of test functions (and methods) in `path` whose source contains `needle`."""
    source = path.read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test"
        ):
            if needle in (ast.get_source_segment(source, node) or ""):
                names.add(node.name)
    return names


def exclusions(sdk: Path, ids: list[str]) -> dict[str, str]:
    """Test id -> why it is not run."""
    excluded: dict[str, str] = {}
    host_users: dict[str, set[str]] = {}
    default_url_users: dict[str, set[str]] = {}
    for test_id in ids:
        file, _, rest = test_id.partition("::")
        function = rest.split("::")[-1].split("[")[0]
        if Path(file).name == "test_network.py":
            excluded[test_id] = REASON_NETWORK_FILE
        elif "internet" in test_id.lower():
            excluded[test_id] = REASON_INTERNET
        else:
            if file not in host_users:
                host_users[file] = functions_calling(sdk / file, "get_host(")
                default_url_users[file] = functions_calling(sdk / file, DEFAULT_SANDBOX_URL)
            if function in host_users[file]:
                excluded[test_id] = REASON_GET_HOST
            elif function in default_url_users[file]:
                excluded[test_id] = REASON_DEFAULT_URL
    return excluded


# --- environment -------------------------------------------------------------------------


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment without E2B_*/AENV_* settings, proxies pointed nowhere, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("E2B_", "AENV_", "VIRTUAL_ENV", "PYTHON"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = DEAD_PROXY
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(extra or {})
    return env


def push_ubuntu_image(registry_url: str, workdir: Path) -> None:
    """Our base rootfs as one layer, pushed as `library/ubuntu:22.04` (unless already there)."""
    import httpx

    from agentenv.config import load_config
    from agentenv.images.base import build_base_template
    from agentenv.images.convert import loop_mount

    from ..images.oci_build import LayerBuilder, build_image, build_layer, push_image

    base = build_base_template(load_config(), progress=lambda _: None)
    marker = workdir / "registry" / "ubuntu-image-base-version"
    url = f"{registry_url}/v2/{UBUNTU_REPOSITORY}/manifests/{UBUNTU_TAG}"
    accept = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    if (
        marker.exists()
        and marker.read_text() == base.version
        and httpx.head(url, headers=accept).status_code == 200
    ):
        log(f"{UBUNTU_REPOSITORY}:{UBUNTU_TAG} already in the local registry")
        return
    log("building the ubuntu:22.04 stand-in layer from the base rootfs")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        with loop_mount(base.rootfs, Path(tmp) / "mnt", readonly=True) as root:
            layer = build_layer(LayerBuilder.from_dir(root, owner=None), "zstd")
    image = build_image([layer], cmd=("/bin/bash",))
    push_image(registry_url, UBUNTU_REPOSITORY, UBUNTU_TAG, image)
    marker.write_text(base.version)
    log(f"pushed {UBUNTU_REPOSITORY}:{UBUNTU_TAG} ({len(layer.blob) / 2**20:.0f} MiB)")


def remove_home(home: Path, keep_log: Path) -> None:
    """Keep the server's log, then delete its home (gigabytes) unless something is mounted."""
    if (home / "server.log").exists():
        shutil.copyfile(home / "server.log", keep_log)
    if str(home) in Path("/proc/mounts").read_text():
        log(f"not removing {home}: something is still mounted under it")
        return
    shutil.rmtree(home, ignore_errors=True)


# --- running -------------------------------------------------------------------------------


PROBE_PLUGIN = """\
# Written by tests/conformance/e2b_suite.py: counts connections to the closed "server".
import os, socket, threading
import pytest

_hits = [0]


def _serve(sock):
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        _hits[0] += 1
        conn.close()


def pytest_configure(config):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ["E2B_SUITE_PROBE_PORT"])))
    sock.listen(64)
    threading.Thread(target=_serve, args=(sock,), daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _hits[0]
    yield
    if _hits[0] != before:
        with open(os.environ["E2B_SUITE_PROBE_OUT"], "a") as out:
            out.write(item.nodeid + "\\n")
"""


def run_pytest(
    python: Path,
    sdk: Path,
    ids: list[str],
    env: dict[str, str],
    junit: Path,
    timeout: int,
    deadline: dt.datetime | None,
    log_file: Path,
    plugins: tuple[str, ...] = (),
) -> int:
    """Run exactly `ids` (in order) with the suite's own configuration."""
    junit.unlink(missing_ok=True)
    args = [
        str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
        f"--timeout={timeout}", f"--junitxml={junit}", "-o", "junit_family=xunit1",
    ]  # fmt: skip
    for plugin in plugins:
        args += ["-p", plugin]
    with open(log_file, "w") as out:
        proc = subprocess.Popen(
            [*args, *ids], cwd=sdk, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        interrupted = False
        while proc.poll() is None:
            if deadline and dt.datetime.now(dt.UTC) >= deadline and not interrupted:
                log("deadline reached: interrupting pytest")
                proc.send_signal(signal.SIGINT)
                interrupted = True
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
            time.sleep(2)
    return proc.returncode


def offline_pass(
    python: Path, sdk: Path, ids: list[str], workdir: Path, deadline: dt.datetime | None
) -> dict[str, tuple[str, str]]:
    """Results of the tests that pass (or skip) without ever contacting the server.

    The SDK is pointed at a loopback port that accepts and drops every connection; a test
    that connected there at all is left for the run against the real server.
    """
    from agentenv.cluster.postgres import free_port

    (workdir / "e2b_suite_probe.py").write_text(PROBE_PLUGIN)
    contacted_file = workdir / "offline-contacted.txt"
    contacted_file.unlink(missing_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(
        {
            "E2B_API_URL": url,
            "E2B_SANDBOX_URL": url,
            "E2B_API_KEY": "e2b_" + "5" * 40,
            "E2B_SUITE_PROBE_PORT": str(port),
            "E2B_SUITE_PROBE_OUT": str(contacted_file),
            "PYTHONPATH": str(workdir),
        }
    )
    junit = workdir / "junit-offline.xml"
    rc = run_pytest(
        python, sdk, ids, env, junit, 20, deadline, workdir / "pytest-offline.log",
        plugins=("e2b_suite_probe",),
    )  # fmt: skip
    contacted = set(contacted_file.read_text().split("\n")) if contacted_file.exists() else set()
    results = parse_junit(junit, ids)
    kept = {
        test_id: result
        for test_id, result in results.items()
        if result[0] in ("passed", "skipped") and test_id not in contacted
    }
    log(f"offline pass exited {rc}: {len(kept)} of {len(ids)} need no server")
    (workdir / "offline-results.json").write_text(json.dumps(kept, indent=1))
    return kept


def parse_junit(junit: Path, ids: list[str]) -> dict[str, tuple[str, str]]:
    """Test id (as collected) -> (outcome, first line of the reason)."""
    results: dict[str, tuple[str, str]] = {}
    if not junit.exists():
        return results
    known = set(ids)
    for case in ET.parse(junit).getroot().iter("testcase"):
        file, name = case.get("file") or "", case.get("name") or ""
        cls = (case.get("classname") or "").split(".")[-1]
        test_id = f"{file}::{cls}::{name}"
        if test_id not in known:
            test_id = f"{file}::{name}"
        outcome, reason = "passed", ""
        for kind, label in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            child = case.find(kind)
            if child is not None:
                outcome, reason = label, first_line(child.get("message") or child.text or "")
                break
        results[test_id] = (outcome, reason)
    return results


def first_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def group_key(reason: str) -> str:
    key = re.sub(r"\b[0-9a-z]{20}\b", "<id>", reason)
    key = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<uuid>", key)
    key = re.sub(r"e2b-test-[a-z0-9]+|test_[a-z0-9]{8}", "<name>", key)
    key = re.sub(r"\b\d+(\.\d+)*\b", "N", key)
    return key[:160]


def report(
    tag: str,
    selected: list[str],
    excluded: dict[str, str],
    results: dict[str, tuple[str, str]],
    started: float,
    out: Path,
) -> dict:
    counts = Counter(outcome for outcome, _ in results.values())
    failing = {k: v for k, v in results.items() if v[0] in ("failed", "errors")}
    groups: dict[str, list[str]] = defaultdict(list)
    for test_id, (_, reason) in sorted(failing.items()):
        groups[group_key(reason)].append(test_id)
    print("\n=== failing tests by first error line ===")
    for key, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"\n[{len(ids)}] {key}")
        for test_id in ids:
            print(f"    {test_id}")
    print("\n=== excluded ===")
    for test_id, reason in sorted(excluded.items()):
        print(f"    {test_id}: {reason}")
    ran = len(results)
    summary = {
        "tag": tag,
        "selected": len(selected),
        "passed": counts["passed"],
        "failed": counts["failed"],
        "errors": counts["errors"],
        "skipped": counts["skipped"],
        "not_run": max(0, len(selected) - ran),
        "excluded": len(excluded),
        "excluded_reasons": dict(Counter(excluded.values())),
        "duration_s": round(time.monotonic() - started),
    }
    out.write_text(
        json.dumps(
            {
                "summary": summary,
                "results": {k: list(v) for k, v in sorted(results.items())},
                "excluded": excluded,
                "failure_groups": groups,
            },
            indent=1,
        )
    )
    print(json.dumps(summary), flush=True)
    return summary


def parse_deadline(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    hour, minute = (int(part) for part in text.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=hour, minute=minute, second=0, microsecond=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO)
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS))
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=180, help="per-test seconds")
    parser.add_argument("--deadline", default=None, help="HH:MM UTC: interrupt pytest then")
    parser.add_argument("--list-only", action="store_true")
    parser.add_argument(
        "--no-offline-pass",
        dest="offline_pass",
        action="store_false",
        help="run every test against the server (default: first run all against a closed "
        "port, and take the results of tests that never connected to it)",
    )
    parser.add_argument(
        "--offline-only", action="store_true", help="stop after the offline pass (no server)"
    )
    parser.add_argument(
        "--reuse-offline", action="store_true", help="take the offline pass from the workdir"
    )
    opts = parser.parse_args(argv)

    started = time.monotonic()
    workdir = opts.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sdk = export_sdk(opts.repo, opts.tag, workdir)
    python = ensure_venv(workdir, sdk)
    all_ids = collect(python, sdk, opts.paths, opts.keyword)
    excluded = exclusions(sdk, all_ids)
    selected = [test_id for test_id in all_ids if test_id not in excluded]
    log(f"collected {len(all_ids)}: {len(selected)} selected, {len(excluded)} excluded")
    if opts.list_only:
        for test_id, reason in sorted(excluded.items()):
            print(f"excluded {test_id}: {reason}")
        print(json.dumps({"tag": opts.tag, "selected": len(selected), "excluded": len(excluded)}))
        return 0

    from agentenv.config import load_config
    from agentenv.guest.kit import build_kit
    from agentenv.images.base import build_base_template

    from ..images.registry_server import running_registry
    from ..live import TEST_KEY, LiveServer

    deadline = parse_deadline(opts.deadline)
    results: dict[str, tuple[str, str]] = {}
    saved = workdir / "offline-results.json"
    if opts.reuse_offline and saved.exists():
        results = {k: tuple(v) for k, v in json.loads(saved.read_text()).items() if k in selected}
        log(f"reusing {len(results)} offline results from {saved}")
    elif opts.offline_pass:
        results = offline_pass(python, sdk, selected, workdir, deadline)
    if opts.offline_only:
        report(opts.tag, selected, excluded, results, started, workdir / "results.json")
        return 0

    cfg = load_config()
    build_kit(cfg, progress=lambda _: None)
    build_base_template(cfg, progress=lambda _: None)
    remaining = [test_id for test_id in selected if test_id not in results]
    junit = workdir / "junit.xml"
    with running_registry(workdir / "registry") as registry:
        push_ubuntu_image(registry.url, workdir)
        home = Path(tempfile.mkdtemp(prefix="server-", dir=workdir))
        server = LiveServer(home, extra_env={"AENV_REGISTRY_MIRRORS": f"docker.io={registry.url}"})
        server.start()
        log(f"server at {server.url}, home {home}; running {len(remaining)} tests")
        try:
            env = clean_env(
                {"E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_API_KEY": TEST_KEY}
            )
            rc = run_pytest(
                python, sdk, remaining, env, junit, opts.timeout, deadline,
                workdir / "pytest.log",
            )  # fmt: skip
            log(f"pytest exited {rc}; output in {workdir / 'pytest.log'}")
        finally:
            server_log = server.log_tail(10**8)
            if re.search(r"mirror .* failed for", server_log):
                log("WARNING: the server fell back from the local mirror; see its log")
            server.close()
            remove_home(home, workdir / "server.log")
    results.update(parse_junit(junit, remaining))
    summary = report(opts.tag, selected, excluded, results, started, workdir / "results.json")
    return 0 if summary["failed"] == summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
