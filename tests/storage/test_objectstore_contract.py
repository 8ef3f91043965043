"""The ObjectStore contract, run against every backend (posix and S3 on a real server)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentenv.storage.objectstore import ObjectNotFound, ObjectStore


def test_put_get_roundtrip(store: ObjectStore) -> None:
    store.put("layers/a.json", b'{"x": 1}')
    assert store.get("layers/a.json") == b'{"x": 1}'
    assert store.exists("layers/a.json")
    assert store.size("layers/a.json") == 8


def test_put_overwrites(store: ObjectStore) -> None:
    store.put("k", b"old")
    store.put("k", b"newer")
    assert store.get("k") == b"newer"
    assert store.size("k") == 5


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.size("empty") == 0
    assert store.exists("empty")


def test_get_range(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put("chunks/r", data)
    assert store.get_range("chunks/r", 0, 10) == data[:10]
    assert store.get_range("chunks/r", 1000, 4096) == data[1000:5096]
    # Fewer bytes only at the end of the object; none past it.
    assert store.get_range("chunks/r", len(data) - 5, 100) == data[-5:]
    assert store.get_range("chunks/r", len(data) + 10, 100) == b""
    assert store.get_range("chunks/r", 7, 0) == b""


def test_put_file_streams_a_large_file(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    payload = bytes(range(251)) * (3 * 1024 * 1024 // 251)
    src.write_bytes(payload)
    store.put_file("snapshots/big.bin", src)
    assert store.size("snapshots/big.bin") == len(payload)
    assert store.get("snapshots/big.bin") == payload
    assert store.get_range("snapshots/big.bin", 2_000_000, 16) == payload[2_000_000:2_000_016]


def test_missing_keys(store: ObjectStore) -> None:
    assert not store.exists("nope")
    with pytest.raises(ObjectNotFound):
        store.get("nope")
    with pytest.raises(ObjectNotFound):
        store.get_range("nope", 0, 10)
    with pytest.raises(ObjectNotFound):
        store.get_range("nope", 0, 0)
    with pytest.raises(ObjectNotFound):
        store.size("nope")
    store.delete("nope")  # absent keys are not an error


def test_delete(store: ObjectStore) -> None:
    store.put("a/b", b"1")
    store.delete("a/b")
    assert not store.exists("a/b")
    with pytest.raises(ObjectNotFound):
        store.get("a/b")
    assert store.list("") == []


def test_list_by_prefix_sorted(store: ObjectStore) -> None:
    for key in ["chunks/bb", "chunks/ab", "chunks/aa", "layers/x.json", "top"]:
        store.put(key, b"x")
    assert store.list("") == ["chunks/aa", "chunks/ab", "chunks/bb", "layers/x.json", "top"]
    assert store.list("chunks/") == ["chunks/aa", "chunks/ab", "chunks/bb"]
    assert store.list("chunks/a") == ["chunks/aa", "chunks/ab"]
    assert store.list("chunks") == ["chunks/aa", "chunks/ab", "chunks/bb"]
    assert store.list("layers/x") == ["layers/x.json"]
    assert store.list("nothing/") == []


def test_ages_of_keys_by_prefix(store: ObjectStore) -> None:
    store.put("age/a", b"1")
    store.put("age/b", b"2")
    store.put("other", b"3")
    ages = store.ages("age/")
    assert sorted(ages) == ["age/a", "age/b"]
    # Just written, by this machine's clock and the store's (S3 stamps whole seconds).
    assert all(-5 < age < 60 for age in ages.values())


@pytest.mark.parametrize("key", ["", "/abs", "../up", "a/../b", "a//b", "a/./b", "a/"])
def test_bad_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.get(key)


def test_concurrent_reader_never_sees_a_partial_object(store: ObjectStore) -> None:
    size = 1024 * 1024
    versions = [bytes([v]) * size for v in (1, 2)]
    store.put("hot", versions[0])
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            data = store.get("hot")
            if data not in versions:
                bad.append(f"{len(data)} bytes, first {data[:1]!r} last {data[-1:]!r}")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            store.put("hot", versions[i % 2])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert bad == []


def test_threads_share_one_store(store: ObjectStore) -> None:
    def work(n: int) -> None:
        for i in range(10):
            key = f"t{n}/k{i}"
            store.put(key, key.encode())
            assert store.get(key) == key.encode()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.list("t")) == 80
