"""The registry client against a real CNCF registry, and scripted servers for auth and retries."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv import errors
from agentenv.images.blobs import iter_layer_bytes, layer_diff_id, open_layer_stream
from agentenv.images.manifest import Descriptor
from agentenv.images.registry import RegistryClient
from agentenv.images.registry_errors import (
    DigestMismatch,
    NoMatchingPlatform,
    RegistryAuthError,
    RegistryError,
    RegistryNotFound,
    RegistryUnreachable,
)
from agentenv.images.registry_transport import RetryPolicy

from . import oci_build as ob
from .registry_server import FakeRequest, FakeServer, Registry, image_routes, running_registry

USERS = {"alice": "s3cret"}


def _sample_layers() -> list[ob.Layer]:
    base = (
        ob.LayerBuilder()
        .dir("etc")
        .file("etc/hostname", b"sandbox\n")
        .file("etc/owned", b"x", uid=1000, gid=1000, xattrs={"user.note": "hi"})
        .symlink("etc/link", "hostname")
        .hardlink("etc/hard", "etc/hostname")
        .dir("dev")
        .device("dev/null", 1, 3)
        .dir("var/cache")
        .file("var/cache/old", b"old")
    )
    top = ob.LayerBuilder().whiteout("etc/owned").opaque("var/cache").file("app/run.sh", b"#!")
    return [
        ob.build_layer(base, "gzip"),
        ob.build_layer(top, "zstd"),
        ob.build_layer(ob.LayerBuilder().file("plain", b"p" * 5000), "none"),
    ]


SAMPLE = ob.build_image(
    _sample_layers(),
    env=("PATH=/usr/bin:/bin", "LANG=C.UTF-8"),
    working_dir="/app",
    user="1000:1000",
    cmd=("run.sh", "--fast"),
    entrypoint=("/bin/sh", "-c"),
)
ARM = ob.build_image([_sample_layers()[0]], architecture="arm64", cmd=("arm",))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as reg:
        ob.push_image(reg.url, "test/sample", "v1", SAMPLE)
        ob.push_index(reg.url, "test/multi", "v1", ob.build_index([SAMPLE, ARM]))
        docker = ob.build_image(
            [ob.build_layer(ob.LayerBuilder().file("d", b"d"), flavour="docker")],
            flavour="docker",
        )
        ob.push_index(reg.url, "test/docker", "v1", ob.build_index([docker], flavour="docker"))
        yield reg


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("auth-registry"), USERS) as reg:
        ob.push_image(reg.url, "private/app", "v1", SAMPLE, auth=reg.auth)
        yield reg


def _client(**kw: object) -> RegistryClient:
    kw.setdefault("use_docker_config", False)
    kw.setdefault("retry", RetryPolicy(backoff=0.01))
    return RegistryClient(**kw)  # type: ignore[arg-type]


# -- resolve ----------------------------------------------------------------------------------


def test_resolve_single_platform(registry: Registry) -> None:
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/sample:v1")
    assert image.digest == SAMPLE.digest
    assert image.index_digest is None
    assert image.media_type == ob.OCI_MANIFEST
    assert image.config_descriptor.digest == SAMPLE.config_digest
    assert [d.digest for d in image.layers] == [layer.digest for layer in SAMPLE.layers]
    assert [d.size for d in image.layers] == [len(layer.blob) for layer in SAMPLE.layers]
    assert [d.compression for d in image.layers] == ["gzip", "zstd", "none"]
    assert image.diff_ids == tuple(layer.diff_id for layer in SAMPLE.layers)
    cfg = image.config
    assert cfg.env == ("PATH=/usr/bin:/bin", "LANG=C.UTF-8")
    assert cfg.env_dict()["LANG"] == "C.UTF-8"
    assert (cfg.working_dir, cfg.user) == ("/app", "1000:1000")
    assert cfg.entrypoint == ("/bin/sh", "-c") and cfg.cmd == ("run.sh", "--fast")
    assert image.raw_config == SAMPLE.config
    assert image.pinned.digest == SAMPLE.digest


def test_resolve_by_digest(registry: Registry) -> None:
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/sample@{SAMPLE.digest}")
    assert image.digest == SAMPLE.digest


def test_resolve_index_picks_linux_amd64(registry: Registry) -> None:
    index = ob.build_index([SAMPLE, ARM])
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/multi:v1")
    assert image.index_digest == index.digest
    assert image.digest == SAMPLE.digest
    assert image.config.architecture == "amd64"
    with _client(platform="linux/arm64") as client:
        arm = client.resolve(f"{registry.host}/test/multi:v1")
    assert arm.digest == ARM.digest and arm.config.cmd == ("arm",)


def test_resolve_index_without_our_platform(registry: Registry) -> None:
    with _client(platform="linux/s390x") as client, pytest.raises(NoMatchingPlatform) as info:
        client.resolve(f"{registry.host}/test/multi:v1")
    assert "linux/amd64, linux/arm64" in str(info.value)
    assert isinstance(info.value, errors.NotFound)


def test_resolve_docker_manifest_list(registry: Registry) -> None:
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/docker:v1")
    assert image.media_type == ob.DOCKER_MANIFEST
    assert image.layers[0].media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip"


def test_unknown_repository_and_tag(registry: Registry) -> None:
    with _client() as client:
        with pytest.raises(RegistryNotFound) as repo:
            client.resolve(f"{registry.host}/test/nope:v1")
        with pytest.raises(RegistryNotFound) as tag:
            client.resolve(f"{registry.host}/test/sample:nope")
    assert isinstance(repo.value, errors.NotFound) and repo.value.status == 404
    # distribution 2.8 answers MANIFEST_UNKNOWN even for a repository it has never seen.
    assert repo.value.code in ("NAME_UNKNOWN", "MANIFEST_UNKNOWN")
    assert repo.value.reason in str(repo.value) and "unknown" in repo.value.reason
    assert tag.value.code == "MANIFEST_UNKNOWN"
    assert "manifest unknown" in str(tag.value)
    assert tag.value.method == "GET" and "/v2/test/sample/manifests/nope" in tag.value.url


# -- blobs --------------------------------------------------------------------------------------


def test_layers_round_trip_to_exact_tar(registry: Registry, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/sample:v1")
        for i, (desc, layer) in enumerate(zip(image.layers, SAMPLE.layers, strict=True)):
            dest = client.fetch_blob(
                image.ref,
                desc,
                tmp_path / f"layer{i}",
                lambda done, total: seen.append((done, total)),
            )
            assert dest.read_bytes() == layer.blob
            assert b"".join(iter_layer_bytes(dest, desc.media_type)) == layer.tar
            assert layer_diff_id(dest, desc.media_type) == image.diff_ids[i]
    assert seen[-1] == (len(SAMPLE.layers[-1].blob),) * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer0", "layer1", "layer2"]


def test_corrupted_blob_is_rejected_and_not_stored(tmp_path: Path) -> None:
    with running_registry(tmp_path / "reg") as reg:
        ob.push_image(reg.url, "test/bad", "v1", SAMPLE)
        layer = SAMPLE.layers[0]
        stored = reg.blob_path(layer.digest)
        flipped = bytes([layer.blob[-1] ^ 0xFF])
        stored.write_bytes(layer.blob[:-1] + flipped)  # same size, different bytes
        out = tmp_path / "out"
        with _client() as client:
            image = client.resolve(f"{reg.host}/test/bad:v1")
            with pytest.raises(DigestMismatch) as info:
                client.fetch_blob(image.ref, image.layers[0], out / "layer")
    assert info.value.expected == layer.digest
    assert list(out.iterdir()) == []


def test_oversized_blob_is_rejected_early(tmp_path: Path) -> None:
    blob = b"x" * 100
    desc = Descriptor("application/vnd.oci.image.layer.v1.tar", ob.digest_of(blob[:10]), 10)
    with FakeServer(lambda r: (200, {}, blob)) as fake, _client() as client:
        with pytest.raises(DigestMismatch, match="10 bytes"):
            client.fetch_blob(f"{fake.host}/r", desc, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


# -- auth ---------------------------------------------------------------------------------------


def test_basic_auth(auth_registry: Registry) -> None:
    ref = f"{auth_registry.host}/private/app:v1"
    with _client(credentials={auth_registry.host: ("alice", "s3cret")}) as client:
        assert client.resolve(ref).digest == SAMPLE.digest
    with _client(credentials={auth_registry.host: ("alice", "wrong")}) as client:
        with pytest.raises(RegistryAuthError) as wrong:
            client.resolve(ref)
    assert wrong.value.status == 401 and isinstance(wrong.value, errors.AenvError)
    assert f"authentication failed for {auth_registry.host}" in str(wrong.value)
    with _client() as client, pytest.raises(RegistryAuthError, match="no credentials"):
        client.resolve(ref)


def test_credentials_from_docker_config(auth_registry: Registry, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    auth = base64.b64encode(b"alice:s3cret").decode()
    config.write_text(json.dumps({"auths": {f"http://{auth_registry.host}/v2/": {"auth": auth}}}))
    with RegistryClient(docker_config=config) as client:
        assert client.resolve(f"{auth_registry.host}/private/app:v1").digest == SAMPLE.digest
    config.write_text(
        json.dumps({"auths": {auth_registry.host: {"username": "alice", "password": "s3cret"}}})
    )
    with RegistryClient(docker_config=config) as client:
        assert client.resolve(f"{auth_registry.host}/private/app:v1").digest == SAMPLE.digest


class BearerRegistry:
    """A fake registry behind a token service: tokens come from /token with Basic auth."""

    def __init__(self, image: ob.BuiltImage, user: str = "bob", password: str = "pw") -> None:
        self.routes = image_routes("team/app", "v1", image)
        self.basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.valid: set[str] = set()
        self.issued = 0
        self.server = FakeServer(self.handle)

    def handle(self, req: FakeRequest) -> tuple[int, dict[str, str], bytes]:
        if req.path == "/token":
            if req.headers.get("authorization") != self.basic:
                return 401, {}, b'{"errors":[{"code":"UNAUTHORIZED","message":"bad login"}]}'
            assert req.query["service"] == ["fake-registry"]
            assert "repository:team/app:pull" in req.query["scope"]
            self.issued += 1
            token = f"tok-{self.issued}"
            self.valid = {token}
            return 200, {"Content-Type": "application/json"}, json.dumps({"token": token}).encode()
        auth = req.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.valid:
            challenge = (
                f'Bearer realm="{self.server.url}/token",service="fake-registry",'
                'scope="repository:team/app:pull"'
            )
            body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            return 401, {"WWW-Authenticate": challenge}, body
        content_type, body = self.routes[req.path]
        return 200, {"Content-Type": content_type}, body


def test_bearer_flow_with_refresh(tmp_path: Path) -> None:
    fake = BearerRegistry(SAMPLE)
    with fake.server, _client(credentials={fake.server.host: ("bob", "pw")}) as client:
        image = client.resolve(f"{fake.server.host}/team/app:v1")
        assert image.digest == SAMPLE.digest and fake.issued == 1  # token reused for the config
        fake.valid = set()  # the token expires
        client.fetch_blob(image.ref, image.layers[0], tmp_path / "l0")
        assert fake.issued == 2
    assert (tmp_path / "l0").read_bytes() == SAMPLE.layers[0].blob


def test_bearer_wrong_password(tmp_path: Path) -> None:
    fake = BearerRegistry(SAMPLE)
    with fake.server, _client(credentials={fake.server.host: ("bob", "nope")}) as client:
        with pytest.raises(RegistryAuthError) as info:
            client.resolve(f"{fake.server.host}/team/app:v1")
    assert info.value.status == 401 and "bad login" in str(info.value)


# -- mirrors and retries --------------------------------------------------------------------


def test_mirror_is_tried_first(registry: Registry) -> None:
    with FakeServer(lambda r: (500, {}, b"")) as origin:
        # The origin is a dead fake; the real registry plays the mirror.
        with _client(mirrors={origin.host: [registry.url]}) as client:
            image = client.resolve(f"{origin.host}/test/sample:v1")
        assert image.digest == SAMPLE.digest
        assert origin.requests == []


def test_mirror_falls_back_to_origin(registry: Registry, tmp_path: Path) -> None:
    with (
        running_registry(tmp_path / "empty-mirror") as empty,
        FakeServer(lambda r: (503, {}, b"")) as broken,
    ):
        mirrors = {registry.host: [broken.url, empty.url]}
        with _client(mirrors=mirrors) as client:
            image = client.resolve(f"{registry.host}/test/sample:v1")
            client.fetch_blob(image.ref, image.layers[1], tmp_path / "blob")
        assert image.digest == SAMPLE.digest
        assert len(broken.paths()) >= 3  # retried, then given up on, for each request
    assert (tmp_path / "blob").read_bytes() == SAMPLE.layers[1].blob


def test_retries_503_then_succeeds() -> None:
    routes = image_routes("r", "v1", SAMPLE)
    failures = {"n": 0}
    slept: list[float] = []

    def handle(req: FakeRequest) -> tuple[int, dict[str, str], bytes]:
        if req.path.endswith("/manifests/v1") and failures["n"] < 2:
            failures["n"] += 1
            return 503, ({"Retry-After": "2"} if failures["n"] == 2 else {}), b""
        content_type, body = routes[req.path]
        return 200, {"Content-Type": content_type}, body

    with FakeServer(handle) as fake, _client(sleep=slept.append) as client:
        assert client.resolve(f"{fake.host}/r:v1").digest == SAMPLE.digest
        assert fake.paths().count("/v2/r/manifests/v1") == 3
    assert slept == [0.01, 2.0]  # backoff first, then what Retry-After asked for


def test_no_retry_on_4xx_and_giving_up_on_5xx() -> None:
    body = b'{"errors":[{"code":"DENIED","message":"go away","detail":null}]}'
    with FakeServer(lambda r: (400, {}, body)) as fake, _client(sleep=lambda s: None) as client:
        with pytest.raises(RegistryError) as bad:
            client.resolve(f"{fake.host}/r:v1")
        assert len(fake.requests) == 1
    assert (bad.value.status, bad.value.code) == (400, "DENIED")
    assert "go away" in str(bad.value)
    with FakeServer(lambda r: (503, {}, b"busy")) as fake, _client(sleep=lambda s: None) as client:
        with pytest.raises(RegistryError) as busy:
            client.resolve(f"{fake.host}/r:v1")
        assert len(fake.requests) == 3
    assert busy.value.status == 503 and "busy" in str(busy.value)


def test_unreachable_registry() -> None:
    with FakeServer(lambda r: (200, {}, b"")) as fake:
        host = fake.host  # closed once the block ends: nothing listens there
    with _client(sleep=lambda s: None) as client, pytest.raises(RegistryUnreachable) as info:
        client.resolve(f"{host}/r:v1")
    assert info.value.status == 503 and host in str(info.value)


def test_layer_entries_survive_the_trip(registry: Registry, tmp_path: Path) -> None:
    with _client() as client:
        image = client.resolve(f"{registry.host}/test/sample:v1")
        base = client.fetch_blob(image.ref, image.layers[0], tmp_path / "base")
        top = client.fetch_blob(image.ref, image.layers[1], tmp_path / "top")
    with open_layer_stream(base, image.layers[0].media_type) as stream:
        members = {m.name: m for m in tarfile.open(fileobj=stream, mode="r|")}
    assert members["dev/null"].ischr() and members["dev/null"].devmajor == 1
    assert members["etc/hard"].islnk() and members["etc/hard"].linkname == "etc/hostname"
    assert members["etc/link"].issym() and members["etc/link"].linkname == "hostname"
    owned = members["etc/owned"]
    assert (owned.uid, owned.gid) == (1000, 1000)
    assert owned.pax_headers["SCHILY.xattr.user.note"] == "hi"
    with open_layer_stream(top, image.layers[1].media_type) as stream:
        names = [m.name for m in tarfile.open(fileobj=stream, mode="r|")]
    assert names == ["etc/.wh.owned", "var/cache/.wh..wh..opq", "app/run.sh"]


def test_layer_from_directory(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_bytes(b"tool")
    (root / "bin" / "tool").chmod(0o755)
    (root / "bin" / "alias").hardlink_to(root / "bin" / "tool")
    (root / "bin" / "sym").symlink_to("tool")
    (root / ".wh.gone").write_bytes(b"")
    layer = ob.build_layer(ob.LayerBuilder.from_dir(root), "gzip")
    with tarfile.open(fileobj=io.BytesIO(layer.tar)) as tar:
        got = {m.name: m for m in tar.getmembers()}
    assert set(got) == {".wh.gone", "bin", "bin/alias", "bin/sym", "bin/tool"}
    assert got["bin/tool"].islnk() or got["bin/alias"].islnk()
    assert got["bin/sym"].linkname == "tool" and got["bin/tool"].uid == 0
    assert ob.build_layer(ob.LayerBuilder.from_dir(root), "gzip").digest == layer.digest
