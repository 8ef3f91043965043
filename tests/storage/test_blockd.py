"""The block daemon end to end: real FUSE mount, real daemon process, real posix store."""

from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentenv.config import Config
from agentenv.storage.blockd import BlockdClient, BlockdError
from agentenv.storage.blockd.common import is_mounted
from agentenv.storage.blockd.fs import Segment, plan_read
from agentenv.storage.filelayer import load_chain, store_file
from agentenv.storage.layer import BLOCK_SIZE, BlockRef, LayerIndex, LayerWriter, Stack
from agentenv.storage.posix import PosixObjectStore

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fuse3",
)

BLOCKS_PER_CHUNK = 64  # CHUNK_TARGET / BLOCK_SIZE: LayerWriter cuts a chunk every 64 blocks
SIZE = 300 * BLOCK_SIZE + 12345  # a partial last block
PAGE = 4096


@dataclass
class Stacks:
    """Two layers in the store and the images they make, computed independently."""

    base: str
    upper: str
    base_image: bytes
    full_image: bytes


def _write_layer(store: PosixObjectStore, layer_id: str, parent: str | None, blocks: dict) -> None:
    writer = LayerWriter(store, layer_id, parent, SIZE)
    for block in sorted(blocks):
        writer.add_block(block, blocks[block])
    writer.finish()


def _overlay(*layers: dict[int, bytes]) -> bytes:
    image = bytearray(301 * BLOCK_SIZE)
    for layer in layers:
        for block, data in layer.items():
            image[block * BLOCK_SIZE : (block + 1) * BLOCK_SIZE] = data
    return bytes(image[:SIZE])


def build_stacks(store: PosixObjectStore, seed: int = 1) -> Stacks:
    rng = random.Random(seed)
    # A format-like base: a dense start, scattered metadata blocks, holes everywhere else.
    base_blocks = [b for b in range(0, 140) if b % 7 != 3] + [150, 151, 200, 201, 202, 299]
    base = {b: rng.randbytes(BLOCK_SIZE) for b in base_blocks}
    # The upper layer overrides some blocks (across chunk boundaries), fills a hole, writes
    # where the base had nothing and writes the partial last block.
    upper = {b: rng.randbytes(BLOCK_SIZE) for b in (0, 3, 63, 64, 65, 130, 250, 300)}
    base_id, upper_id = f"base{seed}", f"upper{seed}"
    _write_layer(store, base_id, None, base)
    _write_layer(store, upper_id, base_id, upper)
    return Stacks(base_id, upper_id, _overlay(base), _overlay(base, upper))


@dataclass
class Env:
    cfg: Config
    client: BlockdClient
    store: PosixObjectStore
    stacks: Stacks


def _mount_count(path: Path) -> int:
    return sum(1 for line in open("/proc/mounts") if line.split()[1] == str(path))


@pytest.fixture
def env() -> Iterator[Env]:
    # Not tmp_path: the socket path must stay under the 108-byte AF_UNIX limit.
    home = Path(tempfile.mkdtemp(prefix="blockd-", dir="/tmp"))
    cfg = Config()
    cfg.paths.home = str(home)
    cfg.cache.max_bytes = 256 * 2**20
    store = PosixObjectStore(cfg.objects_dir)
    client = BlockdClient(cfg, start_timeout=30)
    try:
        yield Env(cfg, client, store, build_stacks(store))
    finally:
        client.stop()
        mnt = client.paths.mnt
        assert _mount_count(mnt) == 0, "the daemon left its mount behind"
        shutil.rmtree(home, ignore_errors=True)


def _drop_page_cache(path: Path) -> None:
    # keep_cache keeps pages across opens; drop them so the next reads reach the daemon.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- read planning, no FUSE ----------------------------------------------------------------


def test_plan_read_merges_adjacent_ranges_of_one_chunk() -> None:
    layer = LayerIndex("l", None, 6 * BLOCK_SIZE)
    layer.blocks = {
        0: BlockRef("a", 0),
        1: BlockRef("a", BLOCK_SIZE),
        2: BlockRef("a", 5 * BLOCK_SIZE),  # same chunk, not contiguous
        3: BlockRef("b", 0),
    }
    stack = Stack([layer])
    assert plan_read(stack, 10, 3 * BLOCK_SIZE) == [
        Segment("a", 10, 2 * BLOCK_SIZE - 10),
        Segment("a", 5 * BLOCK_SIZE, BLOCK_SIZE),
        Segment("b", 0, 10),
    ]
    assert plan_read(stack, 3 * BLOCK_SIZE + 5, 3 * BLOCK_SIZE) == [
        Segment("b", 5, BLOCK_SIZE - 5),
        Segment(None, 0, 2 * BLOCK_SIZE),  # two holes merge; clamped at the end
    ]


def test_plan_read_of_page_sized_blocks() -> None:
    layer = LayerIndex("ram", None, 4 * PAGE, block_size=PAGE)
    layer.blocks = {0: BlockRef("a", 0), 1: BlockRef("a", PAGE), 3: BlockRef("a", 2 * PAGE)}
    assert plan_read(Stack([layer]), 100, 4 * PAGE) == [
        Segment("a", 100, 2 * PAGE - 100),
        Segment(None, 0, PAGE),
        Segment("a", 2 * PAGE, PAGE),
    ]


# -- the daemon --------------------------------------------------------------------------


def test_image_reads_back_byte_for_byte(env: Env) -> None:
    s = env.stacks
    path, size = env.client.mount("full", [s.base, s.upper])
    assert path == env.client.paths.mnt / "full.img" and size == SIZE == path.stat().st_size
    assert path.read_bytes() == s.full_image
    # Holes (never written, and the untouched tail) read as zeros.
    with open(path, "rb") as f:
        for block in (10, 140, 298):
            f.seek(block * BLOCK_SIZE)
            assert f.read(BLOCK_SIZE) == bytes(BLOCK_SIZE)
    stats = env.client.stats()
    assert stats["fs"]["read_errors"] == 0 and stats["cache"]["misses"] > 0


def test_guest_ram_layers_serve_a_private_mapping(env: Env, tmp_path: Path) -> None:
    """RAM stored in 4 KiB blocks over its previous version, mapped copy-on-write as a
    VMM maps a snapshot's RAM: reads see the stack, writes stay in the mapping."""
    rng = random.Random(7)
    ram = bytearray(600 * PAGE)
    for page in rng.sample(range(600), 200):
        ram[page * PAGE : (page + 1) * PAGE] = rng.randbytes(PAGE)
    source = tmp_path / "memory"
    source.write_bytes(ram)
    first, _ = store_file(env.store, source, None, PAGE)
    for page in (0, 1, 599):
        ram[page * PAGE : (page + 1) * PAGE] = rng.randbytes(PAGE)
    source.write_bytes(ram)
    top, _ = store_file(env.store, source, first, PAGE)
    path, size = env.client.mount("ram", load_chain(env.store, top).layer_ids)
    assert size == len(ram) and path.read_bytes() == ram
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    mapped[:4] = b"mine"
    assert mapped[4:] == ram[4:] and path.read_bytes() == ram
    mapped.close()


def test_odd_sized_sequential_and_random_reads(env: Env) -> None:
    s = env.stacks
    path, _ = env.client.mount("full", [s.base, s.upper])
    expected = s.full_image
    fd = os.open(path, os.O_RDONLY)
    try:
        for step in (12345, 4097, 3 * BLOCK_SIZE + 1):
            _drop_page_cache(path)
            got = bytearray()
            while chunk := os.pread(fd, step, len(got)):
                got += chunk
            assert bytes(got) == expected, f"sequential reads of {step}"
        rng = random.Random(7)
        edges = [BLOCKS_PER_CHUNK * BLOCK_SIZE, BLOCK_SIZE, 2 * BLOCKS_PER_CHUNK * BLOCK_SIZE]
        cases = [(e - 5, 10) for e in edges] + [(SIZE - 100, 1000), (SIZE, 10), (0, 1)]
        cases += [(rng.randrange(SIZE), rng.randrange(1, 3 * BLOCK_SIZE)) for _ in range(300)]
        before = env.client.stats()["fs"]["reads"]
        for i, (off, n) in enumerate(cases):
            if i % 50 == 0:
                _drop_page_cache(path)
            assert os.pread(fd, n, off) == expected[off : off + n], (off, n)
        assert env.client.stats()["fs"]["reads"] > before  # they reached the daemon
    finally:
        os.close(fd)


def test_writes_are_refused(env: Env) -> None:
    path, _ = env.client.mount("full", [env.stacks.base, env.stacks.upper])
    for flags in (os.O_RDWR, os.O_WRONLY, os.O_RDONLY | os.O_TRUNC):
        with pytest.raises(OSError) as exc:
            os.close(os.open(path, flags))
        assert exc.value.errno == errno.EROFS
    for action in (
        lambda: os.truncate(path, 0),
        lambda: (path.parent / "new.img").write_bytes(b"x"),
        lambda: path.unlink(),
        lambda: os.chmod(path, 0o644),
    ):
        with pytest.raises(OSError) as exc:
            action()
        assert exc.value.errno == errno.EROFS
    assert path.read_bytes() == env.stacks.full_image


def test_two_stacks_unmount_and_remount(env: Env) -> None:
    s, client = env.stacks, env.client
    full, _ = client.mount("full", [s.base, s.upper])
    base, _ = client.mount("base", [s.base])
    assert sorted(os.listdir(client.paths.mnt)) == ["base.img", "full.img"]
    assert full.read_bytes() == s.full_image and base.read_bytes() == s.base_image
    # Mounting again is idempotent; other layers under a served name are a conflict.
    assert client.mount("full", [s.base, s.upper]) == (full, SIZE)
    with pytest.raises(BlockdError) as exc:
        client.mount("full", [s.base])
    assert exc.value.code == "conflict"
    # An open file survives its unmount, like an unlinked file.
    with open(full, "rb") as f:
        assert client.unmount("full") is True
        assert not full.exists() and os.listdir(client.paths.mnt) == ["base.img"]
        f.seek(BLOCK_SIZE * 64)
        assert f.read(1000) == s.full_image[BLOCK_SIZE * 64 : BLOCK_SIZE * 64 + 1000]
    assert client.unmount("full") is False
    # The name can come back with other content (a new inode: no stale page cache).
    path, _ = client.mount("full", [s.base])
    assert path.read_bytes() == s.base_image
    assert [m["name"] for m in client.status()["mounts"]] == ["base", "full"]


def test_bad_requests(env: Env) -> None:
    client, s = env.client, env.stacks
    cases = {
        "not_found": ("x", ["nosuchlayer"]),
        "bad_chain": ("x", [s.upper]),  # upper without its base
        "bad_request": ("../x", [s.base]),
    }
    for code, (name, layers) in cases.items():
        with pytest.raises(BlockdError) as exc:
            client.mount(name, layers)
        assert exc.value.code == code, exc.value
    with pytest.raises(BlockdError) as exc:
        client.request({"op": "nope"})
    assert exc.value.code == "bad_request"
    with pytest.raises(BlockdError):
        client.prefetch("x")
    assert os.listdir(client.paths.mnt) == []


def test_prefetch_fills_the_cache(env: Env) -> None:
    s = env.stacks
    env.client.mount("full", [s.base, s.upper])
    chunks = env.client.prefetch("full")
    assert chunks == len(Stack([_index(env, s.base), _index(env, s.upper)]).chunks())
    for _ in range(200):
        if env.client.stats()["cache"]["entries"] == chunks:
            break
        threading.Event().wait(0.05)
    assert env.client.stats()["cache"]["entries"] == chunks


def _index(env: Env, layer_id: str) -> LayerIndex:
    return LayerIndex.from_json(env.store.get(f"layers/{layer_id}.json"))


def test_daemon_outlives_its_client_and_restarts_with_its_mounts(env: Env) -> None:
    s, client = env.stacks, env.client
    # Another process (the "server") starts the daemon, mounts, and goes away.
    script = textwrap.dedent(
        f"""
        from agentenv.config import Config
        from agentenv.storage.blockd import BlockdClient
        cfg = Config()
        cfg.paths.home = {env.cfg.paths.home!r}
        BlockdClient(cfg).mount("full", [{s.base!r}, {s.upper!r}])
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    status = client.try_status()
    assert status is not None and [m["name"] for m in status["mounts"]] == ["full"]
    pid = status["pid"]
    assert os.getsid(pid) == pid != os.getsid(0)  # its own session
    path = client.paths.image("full")
    assert path.read_bytes() == s.full_image
    assert client.ensure_running() == pid  # never a second daemon

    # A clean restart serves the recorded mounts again.
    client.stop()
    assert not is_mounted(client.paths.mnt) and not path.exists()
    new_pid = client.ensure_running()
    assert new_pid != pid
    assert path.read_bytes() == s.full_image

    # A crash leaves a dead mount; the next daemon detaches it and serves again.
    os.kill(new_pid, signal.SIGKILL)
    client._wait_gone(new_pid, 10)
    assert is_mounted(client.paths.mnt)
    with pytest.raises(OSError) as exc:
        os.listdir(client.paths.mnt)
    assert exc.value.errno == errno.ENOTCONN
    client.mount("base", [s.base])  # the client restarts the daemon itself
    assert _mount_count(client.paths.mnt) == 1
    assert path.read_bytes() == s.full_image
    assert client.paths.image("base").read_bytes() == s.base_image


def test_concurrent_starts_make_one_daemon(env: Env) -> None:
    pids: list[int] = []
    clients = [BlockdClient(env.cfg) for _ in range(4)]
    threads = [
        threading.Thread(target=lambda c=c: pids.append(c.ensure_running())) for c in clients
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(pids) == 4 and len(set(pids)) == 1
    assert _mount_count(env.client.paths.mnt) == 1
    env.client.stop()
    for c in clients:  # reap whichever of them spawned it
        c.stop()
    assert not os.path.exists(f"/proc/{pids[0]}")


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-utils")
def test_qemu_reads_through_a_qcow2_overlay(env: Env, tmp_path: Path) -> None:
    s = env.stacks
    path, _ = env.client.mount("full", [s.base, s.upper])
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(path), str(overlay)],
        check=True,
        timeout=60,
    )
    expected = tmp_path / "expected.raw"
    expected.write_bytes(s.full_image)
    compare = subprocess.run(
        ["qemu-img", "compare", "-f", "qcow2", "-F", "raw", str(overlay), str(expected)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compare.returncode == 0, compare.stdout + compare.stderr
    # A hole and a written block, read by QEMU's block layer through the overlay.
    hole = 140 * BLOCK_SIZE
    byte = s.full_image[250 * BLOCK_SIZE]
    io = subprocess.run(
        [
            "qemu-io", "-f", "qcow2", "-r",
            "-c", f"read -P 0 {hole} {BLOCK_SIZE}",
            "-c", f"read -P {byte} {250 * BLOCK_SIZE} 1",
            str(overlay),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert io.returncode == 0 and "Pattern verification failed" not in io.stdout, io.stdout
