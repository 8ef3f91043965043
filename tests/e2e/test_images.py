"""OCI images from a real registry → block layers → sandboxes, with a small chunk cache."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from agentenv.config import load_config
from agentenv.images.base import build_base_template
from agentenv.images.convert import loop_mount
from agentenv.net.netns import list_namespaces
from agentenv.storage.blockd import BlockdClient

from ..images.oci_build import LayerBuilder, build_image, build_layer, push_image
from ..images.registry_server import Registry, running_registry
from ..live import AENV, TEST_KEY, LiveServer
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm

APP_DATA = os.urandom(3 * 2**20)
OTHER_DATA = os.urandom(2 * 2**20)


@dataclass
class Images:
    registry: Registry
    app: str
    other: str


@pytest.fixture(scope="module")
def images(kit_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    """Two multi-layer Debian images sharing their base layer, pushed to a local registry."""
    base = build_base_template(load_config(), progress=lambda _: None)
    with loop_mount(base.rootfs, tmp_path_factory.mktemp("base-mnt"), readonly=True) as root:
        debian = build_layer(LayerBuilder.from_dir(root, owner=None), "zstd")
    app_layer = build_layer(
        LayerBuilder()
        .dir("srv/app", uid=1000, gid=1000)
        .file("srv/app/data.bin", APP_DATA, uid=1000, gid=1000)
        .hardlink("srv/app/data.link", "srv/app/data.bin")
        .symlink("srv/app/current", "data.bin")
        .whiteout("usr/bin/less")
        .opaque("etc/sudoers.d")
        .file("etc/sudoers.d/app", b"# app\n", mode=0o440),
        "gzip",
    )
    other_layer = build_layer(LayerBuilder().file("opt/other.bin", OTHER_DATA), "gzip")
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        push_image(
            registry.url,
            "demo/app",
            "v1",
            build_image(
                [debian, app_layer],
                env=("PATH=/usr/local/bin:/usr/bin:/bin", "APP_MODE=test"),
                working_dir="/srv/app",
                user="user",
                cmd=("/bin/sh", "-c", "echo started-as-$(whoami) > /tmp/cmd-ran; exec sleep 600"),
            ),
        )
        push_image(registry.url, "demo/other", "v1", build_image([debian, other_layer]))
        yield Images(registry, f"{registry.host}/demo/app:v1", f"{registry.host}/demo/other:v1")


def aenv(server: LiveServer, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AENV_API_URL": server.url, "AENV_API_KEY": TEST_KEY}
    return subprocess.run([AENV, *args], capture_output=True, env=env, timeout=900)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_app(server: LiveServer, sandbox: dict) -> None:
    """The image's files, config (user, workdir, env) and its command all took effect."""
    ran = run(
        server,
        sandbox,
        "for i in $(seq 50); do cat /tmp/cmd-ran 2>/dev/null && break; sleep 0.2; done",
    )
    assert ran[0] == "started-as-user\n"
    out, err, code = run(server, sandbox, "whoami; pwd; echo $APP_MODE; sha256sum data.bin")
    assert code == 0, err
    assert out.splitlines()[:3] == ["user", "/srv/app", "test"]
    assert out.splitlines()[3].split()[0] == sha(APP_DATA)
    out, _, _ = run(
        server,
        sandbox,
        "stat -c '%U %h' data.bin; readlink current; ls /usr/bin/less 2>&1 | head -1;"
        " ls /etc/sudoers.d",
    )
    lines = out.splitlines()
    assert lines[0] == "user 2"
    assert lines[1] == "data.bin"
    assert "No such file" in lines[2]
    assert lines[3:] == ["app"]


def test_pull_with_cli_then_sandbox(server: LiveServer, images: Images, vms: VmFactory) -> None:
    with server.client() as api:
        # A create never pulls by itself (`registry.pull_on_create` is off): E2B's 404.
        unpulled = api.post("/sandboxes", json={"templateID": images.app})
        assert unpulled.status_code == 404
        assert unpulled.json()["message"].startswith(f"template '{images.app}' not found")
    pulled = aenv(server, "pull", images.app, "--name", "app")
    assert pulled.returncode == 0, pulled.stderr.decode()
    assert pulled.stdout.decode().strip() == "app"
    listed = json.loads(aenv(server, "template", "ls", "-o", "json").stdout)
    assert {"base", "app"} <= {t["templateID"] for t in listed}
    sandbox = vms.create(server, templateID="app")
    check_app(server, sandbox)
    kill(server, sandbox["sandboxID"])
    with server.client() as api:
        missing = api.post(
            "/templates/pull", json={"image": f"{images.registry.host}/demo/none:v1"}
        )
        assert missing.status_code == 404
        assert missing.json()["code"] == 404


def test_sandbox_straight_from_an_image_reference(
    fresh_server: LiveServer, images: Images, vms: VmFactory
) -> None:
    """With `registry.pull_on_create`, a full reference is pulled once, by its create."""
    fresh_server.extra_env["AENV_REGISTRY_PULL_ON_CREATE"] = "true"
    fresh_server.start()
    sandbox = vms.create(fresh_server, templateID=images.other)
    out, _, code = run(fresh_server, sandbox, "sha256sum /opt/other.bin; cat /etc/debian_version")
    assert code == 0
    assert out.split()[0] == sha(OTHER_DATA)
    kill(fresh_server, sandbox["sandboxID"])
    with fresh_server.client() as api:
        listed = [t for t in api.get("/templates").json() if t.get("source") == images.other]
        assert [t["templateID"] for t in listed] == ["other-v1"]
        # A short name is a template's `name:tag`, never a Docker Hub image.
        short = api.post("/sandboxes", json={"templateID": "other:v1"})
        assert short.status_code == 404
        assert short.json()["message"] == "template 'other' not found"


def _cache_stats(server: LiveServer) -> dict:
    return BlockdClient(load_config(env=server.env)).stats()["cache"]


def test_small_cache_runs_every_image(
    fresh_server: LiveServer, images: Images, vms: VmFactory
) -> None:
    """A cache a fifth of the images' size still runs each, one after another and at once."""
    fresh_server.start()
    with fresh_server.client() as api:
        sizes = []
        for ref, name in ((images.app, "app"), (images.other, "other")):
            lines = api.post("/templates/pull", json={"image": ref, "name": name}).text
            assert '"template"' in lines, lines
        objects = fresh_server.home / "objects" / "chunks"
        sizes = [p.stat().st_size for p in objects.rglob("*") if p.is_file()]
    total = sum(sizes)
    fresh_server.stop()
    fresh_server.extra_env["AENV_CACHE_MAX_BYTES"] = str(total // 5)
    BlockdClient(load_config(env=fresh_server.env)).stop()  # restart it with the small cap
    fresh_server.start()

    first = vms.create(fresh_server, templateID="app")
    stats = _cache_stats(fresh_server)
    # The sandbox answered while most of its image was still only in the object store.
    assert stats["fetched_bytes"] < total / 2
    check_app(fresh_server, first)
    kill(fresh_server, first["sandboxID"])
    second = vms.create(fresh_server, templateID="other")
    assert run(fresh_server, second, "sha256sum /opt/other.bin")[0].split()[0] == sha(OTHER_DATA)
    kill(fresh_server, second["sandboxID"])

    with ThreadPoolExecutor(2) as pool:
        boxes = list(pool.map(lambda t: vms.create(fresh_server, templateID=t), ["app", "other"]))
    check_app(fresh_server, boxes[0])
    assert run(fresh_server, boxes[1], "sha256sum /opt/other.bin")[0].split()[0] == sha(OTHER_DATA)
    for box in boxes:
        kill(fresh_server, box["sandboxID"])
    stats = _cache_stats(fresh_server)
    assert stats["bytes_used"] <= total // 5
    assert stats["evictions"] > 0

    # The cache survives a restart of the block daemon.
    entries = stats["entries"]
    fresh_server.stop()
    BlockdClient(load_config(env=fresh_server.env)).stop()
    fresh_server.start()
    assert _cache_stats(fresh_server)["entries"] == entries


def test_s3_backend_end_to_end(
    fresh_server: LiveServer, images: Images, s3_endpoint: str, s3_bucket: str, vms: VmFactory
) -> None:
    """Layers and templates in S3 (a real S3 server); a second node, sharing the state
    store, sees the template and resumes a sandbox of it the first node paused."""
    s3 = {
        "AENV_STATE_URL": f"sqlite:///{fresh_server.home.parent / 'shared-state.db'}",
        "AENV_STORAGE_BACKEND": "s3",
        "AENV_STORAGE_S3_ENDPOINT": s3_endpoint,
        "AENV_STORAGE_S3_BUCKET": s3_bucket,
        "AENV_STORAGE_S3_PATH_STYLE": "true",
        "AENV_STORAGE_S3_ACCESS_KEY": "testing",
        "AENV_STORAGE_S3_SECRET_KEY": "testing",
    }
    fresh_server.extra_env.update(s3)
    fresh_server.start()
    assert aenv(fresh_server, "pull", images.app, "--name", "app").returncode == 0
    assert not (fresh_server.home / "objects").exists()
    sandbox = vms.create(fresh_server, templateID="app")
    check_app(fresh_server, sandbox)
    kill(fresh_server, sandbox["sandboxID"])
    paused = vms.create(fresh_server, templateID="app")
    assert run(fresh_server, paused, "echo kept > /tmp/kept; echo kept > note")[2] == 0
    _pause_until_stored(fresh_server, paused["sandboxID"])
    fresh_server.stop()
    # That node is gone for good: nothing is served from there, its namespaces go.
    BlockdClient(load_config(env=fresh_server.env)).stop()
    for netns in list_namespaces(fresh_server.prefix):
        subprocess.run(["ip", "netns", "del", netns], check=False)

    # Another home: the template's image is served under another path there.
    second = vms.own(LiveServer(fresh_server.home.parent / "second-node", extra_env=dict(s3)))
    second.home.mkdir()
    second.start()
    with second.client() as api:
        assert "app" in {t["templateID"] for t in api.get("/v2/templates").json()}
        resumed = api.post(f"/sandboxes/{paused['sandboxID']}/connect", json={"timeout": 60})
        assert resumed.status_code in (200, 201), resumed.text
    out, err, code = run(second, resumed.json(), "cat /tmp/kept note; sha256sum data.bin")
    assert code == 0, err
    assert out.splitlines()[:2] == ["kept", "kept"] and sha(APP_DATA) in out
    kill(second, paused["sandboxID"])
    box = vms.create(second, templateID="app")
    check_app(second, box)
    kill(second, box["sandboxID"])


def _pause_until_stored(server: LiveServer, sandbox_id: str) -> None:
    with server.client() as api:
        paused = api.post(f"/sandboxes/{sandbox_id}/pause", json={"waitStored": True})
        assert paused.status_code == 204, paused.text
        assert api.get(f"/sandboxes/{sandbox_id}").json()["storage"] == "stored"
