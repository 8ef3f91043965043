"""The directory-backed object store: atomic publication, temp files, config wiring."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentenv.config import load_config
from agentenv.storage.objectstore import ObjectStoreError
from agentenv.storage.posix import PosixObjectStore
from agentenv.storage.stores import open_object_store


def test_objects_are_plain_files_under_root(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    store.put("chunks/abc", b"data")
    assert (tmp_path / "chunks" / "abc").read_bytes() == b"data"


def test_no_temp_files_left_and_temp_files_are_not_listed(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    store.put("a/b", b"1")
    src = tmp_path.parent / "src.bin"
    src.write_bytes(b"2" * 10000)
    store.put_file("a/c", src)
    assert sorted(os.listdir(tmp_path / "a")) == ["b", "c"]
    # A writer that died mid-put leaves a temp file: it is not an object.
    (tmp_path / "a" / ".tmp-dead").write_bytes(b"partial")
    assert store.list("a/") == ["a/b", "a/c"]
    with pytest.raises(ValueError):
        store.get("a/.tmp-dead")


def test_failed_put_file_leaves_nothing(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "root")
    with pytest.raises(ObjectStoreError, match="k"):
        store.put_file("k", tmp_path / "missing.bin")
    assert not store.exists("k")
    assert store.list("") == []


def test_a_directory_is_not_an_object(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    store.put("dir/leaf", b"x")
    assert not store.exists("dir")


def test_a_second_instance_on_the_same_root_sees_the_objects(tmp_path: Path) -> None:
    # What a shared filesystem gives two hosts.
    PosixObjectStore(tmp_path).put("layers/l.json", b"{}")
    assert PosixObjectStore(tmp_path).get("layers/l.json") == b"{}"


def test_config_default_is_posix_under_home(tmp_path: Path) -> None:
    cfg = load_config(env={"AENV_HOME": str(tmp_path)})
    store = open_object_store(cfg)
    assert isinstance(store, PosixObjectStore)
    assert store.root == tmp_path / "objects"
    cfg = load_config(env={"AENV_HOME": str(tmp_path), "AENV_STORAGE_POSIX_ROOT": "/srv/x"})
    assert cfg.objects_dir == Path("/srv/x")
