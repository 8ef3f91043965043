"""Pull from a real registry into block layers in a real object store, and back out."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.errors import Conflict
from agentenv.images.convert import loop_mount, materialize
from agentenv.images.pull import ImagePuller, default_name
from agentenv.images.reference import parse_reference
from agentenv.images.registry import RegistryClient
from agentenv.images.templates import TemplateRegistry
from agentenv.storage.layer import Stack, layer_key
from agentenv.storage.posix import PosixObjectStore

from .oci_build import LayerBuilder, build_image, build_layer, push_image
from .registry_server import Registry, running_registry

SIZE = 256 * 2**20


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as running:
        base = build_layer(
            LayerBuilder()
            .dir("etc")
            .file("etc/os-release", b"ID=test\n")
            .file("bin/tool", b"#!/bin/sh\necho tool\n", mode=0o755),
            "gzip",
        )
        app = build_layer(
            LayerBuilder()
            .file("app/main.py", b"print('hi')\n", uid=1000, gid=1000)
            .whiteout("bin/tool"),
            "zstd",
        )
        other = build_layer(LayerBuilder().file("srv/data", b"x" * 300_000), "gzip")
        push_image(
            running.url,
            "demo/app",
            "v1",
            build_image(
                [base, app], env=("PATH=/bin", "MODE=prod"), working_dir="/app", user="1000"
            ),
        )
        push_image(running.url, "demo/other", "v1", build_image([base, other]))
        yield running


class CountingRegistry(RegistryClient):
    """Counts blob downloads, to show work is done once."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0
        self._count_lock = threading.Lock()

    def fetch_blob(self, *args, **kwargs):
        with self._count_lock:
            self.fetches += 1
        return super().fetch_blob(*args, **kwargs)


def _puller(tmp_path: Path, client: RegistryClient) -> tuple[ImagePuller, PosixObjectStore]:
    store = PosixObjectStore(tmp_path / "objects")
    puller = ImagePuller(store, client, TemplateRegistry(store), tmp_path / "work", SIZE)
    return puller, store


def test_pull_converts_once_and_shares_layers(registry: Registry, tmp_path: Path) -> None:
    client = CountingRegistry()
    puller, store = _puller(tmp_path, client)
    record = puller.pull(f"{registry.host}/demo/app:v1", "app", progress=lambda _: None)
    assert record.env == {"PATH": "/bin", "MODE": "prod"}
    assert (record.workdir, record.user) == ("/app", "1000")
    assert len(record.layers) == 3  # format layer + two image layers
    assert all(store.exists(layer_key(layer)) for layer in record.layers)
    assert client.fetches == 2

    keys = set(store.list(""))
    again = puller.pull(f"{registry.host}/demo/app:v1", "app", progress=lambda _: None)
    assert again.layers == record.layers
    assert set(store.list("")) == keys
    assert client.fetches == 2

    other = puller.pull(f"{registry.host}/demo/other:v1", progress=lambda _: None)
    assert other.template_id == "other-v1"
    assert other.layers[:2] == record.layers[:2]
    assert client.fetches == 3


def test_pulled_files_are_byte_identical(registry: Registry, tmp_path: Path) -> None:
    puller, store = _puller(tmp_path, RegistryClient())
    record = puller.pull(f"{registry.host}/demo/app:v1", "app", progress=lambda _: None)
    from agentenv.images.convert import load_layer

    stack = Stack([load_layer(store, layer) for layer in record.layers])
    image = tmp_path / "disk.img"
    materialize(stack, store, image)
    with loop_mount(image, tmp_path / "mnt", readonly=True) as root:
        assert (root / "etc/os-release").read_bytes() == b"ID=test\n"
        main = root / "app/main.py"
        assert (
            hashlib.sha256(main.read_bytes()).digest() == hashlib.sha256(b"print('hi')\n").digest()
        )
        assert (main.stat().st_uid, main.stat().st_gid) == (1000, 1000)
        assert not (root / "bin/tool").exists()


def test_concurrent_pulls_do_the_work_once(registry: Registry, tmp_path: Path) -> None:
    client = CountingRegistry()
    puller, _ = _puller(tmp_path, client)
    results = []

    def pull() -> None:
        results.append(puller.pull(f"{registry.host}/demo/app:v1", "app", progress=lambda _: None))

    threads = [threading.Thread(target=pull) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3
    assert len({tuple(r.layers) for r in results}) == 1
    assert client.fetches == 2


def test_a_creates_pull_happens_once_and_takes_no_other_images_name(
    registry: Registry, tmp_path: Path
) -> None:
    client = CountingRegistry()
    puller, _ = _puller(tmp_path, client)
    ref = parse_reference(f"{registry.host}/demo/app:v1")
    record = puller.pull_once(ref, progress=lambda _: None)
    assert (record.template_id, record.source, client.fetches) == ("app-v1", str(ref), 2)
    # Pulled once: the next create asks no registry.
    assert puller.pull_once(ref, progress=lambda _: None) == record
    assert client.fetches == 2
    # Another image whose default name is taken does not replace that template.
    elsewhere = parse_reference(f"{registry.host}/other/app:v1")
    with pytest.raises(Conflict, match="was pulled from"):
        puller.pull_once(elsewhere, progress=lambda _: None)


def test_default_names() -> None:
    assert default_name(parse_reference("ubuntu:22.04")) == "ubuntu-22.04"
    assert default_name(parse_reference("ghcr.io/org/my_tool")) == "my-tool-latest"
