"""Guest kit: pure helpers (hashing, module order, cmdline) and one real microVM boot."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agentenv.config import Config, load_config
from agentenv.guest import kernel as kernel_mod
from agentenv.guest.buildutil import KitBuildError, remove_tree
from agentenv.guest.debootstrap import clean_tree
from agentenv.guest.ext4 import auto_size_mb, pack_ext4, tree_usage
from agentenv.guest.initramfs import INIT_SCRIPT
from agentenv.guest.kernel import module_load_order, module_name
from agentenv.guest.kit import (
    guest_args,
    kit_version,
    load_kit,
    parse_aenv_args,
    prune_kits,
)

from ..rawvm import RawVm, init_agent, run_command

MODULES_DEP = """\
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_balloon.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
"""  # noqa: E501


def _sources(tmp_path: Path) -> tuple[Path, Path]:
    init = tmp_path / "init.sh"
    init.write_text("#!/bin/sh\necho hi\n")
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "__init__.py").write_text("")
    (agent / "server.py").write_text("PORT = 49983\n")
    return init, agent


def test_version_is_stable_and_tracks_every_input(tmp_path: Path) -> None:
    init, agent = _sources(tmp_path)
    cfg = Config()
    base = kit_version(cfg, init_script=init, agent_src=agent)
    assert base == kit_version(Config(), init_script=init, agent_src=agent)

    (agent / "__pycache__").mkdir()
    (agent / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"junk")
    assert kit_version(cfg, init_script=init, agent_src=agent) == base, "caches are not inputs"

    seen = {base}
    (agent / "server.py").write_text("PORT = 1\n")
    seen.add(kit_version(cfg, init_script=init, agent_src=agent))
    (agent / "sub").mkdir()
    (agent / "sub" / "new.py").write_text("")
    seen.add(kit_version(cfg, init_script=init, agent_src=agent))
    init.write_text("#!/bin/sh\necho changed\n")
    seen.add(kit_version(cfg, init_script=init, agent_src=agent))
    for field, value in (
        ("mirror", "http://mirror.example/debian"),
        ("suite", "trixie"),
        ("kernel_package", "linux-image-amd64"),
    ):
        other = Config()
        setattr(other.kit, field, value)
        seen.add(kit_version(other, init_script=init, agent_src=agent))
    assert len(seen) == 7


def test_load_and_prune_kits(tmp_path: Path) -> None:
    cfg = Config()
    cfg.paths.kit_dir = str(tmp_path)
    assert load_kit(cfg) is None
    current = kit_version(cfg)
    for version in (current, "old1", "old2"):
        (tmp_path / version).mkdir()
        for name in ("vmlinuz", "initrd.img", "runtime.ext4"):
            (tmp_path / version / name).write_text("x")
        (tmp_path / version / "manifest.json").write_text(json.dumps({"version": version}))
    (tmp_path / "cache").mkdir()
    kit = load_kit(cfg)
    assert kit is not None and kit.version == current and kit.kernel.parent.name == current
    assert prune_kits(cfg, keep=["old2"]) == [tmp_path / "old1"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(
        ["cache", current, "old2"]
    )


def test_module_order_puts_dependencies_first() -> None:
    order = [module_name(p) for p in module_load_order(kernel_mod.WANTED_MODULES[:4], MODULES_DEP)]
    assert len(order) == len(set(order))
    assert set(order) == {
        "virtio_ring", "virtio", "virtio_mmio", "virtio_blk",
        "failover", "net_failover", "virtio_net", "virtio_balloon",
    }  # fmt: skip
    before = [
        ("virtio_ring", "virtio"),
        ("virtio", "virtio_mmio"),
        ("virtio_mmio", "virtio_blk"),
        ("failover", "net_failover"),
        ("net_failover", "virtio_net"),
    ]
    for first, then in before:
        assert order.index(first) < order.index(then)
    with pytest.raises(KitBuildError, match="virtio_gpu"):
        module_load_order(["virtio_gpu"], MODULES_DEP)


def test_module_name_handles_compressed_modules() -> None:
    assert module_name("kernel/drivers/net/virtio_net.ko.xz") == "virtio_net"
    assert module_name("kernel/drivers/virtio/virtio-mmio.ko.zst") == "virtio_mmio"
    assert module_name("virtio.ko") == "virtio"


def test_guest_args_carry_network_for_init() -> None:
    line = guest_args("169.254.0.21", 30, "169.254.0.22", hostname="box")
    args = parse_aenv_args("console=ttyS0 " + line)
    assert args == {"ip": "169.254.0.21/30", "gw": "169.254.0.22", "hostname": "box"}
    with pytest.raises(ValueError):
        guest_args("169.254.0.21", 30, "169.254.0.22", hostname="two words")


def test_resolve_image_package_follows_metapackage(monkeypatch: pytest.MonkeyPatch) -> None:
    out = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n"
    monkeypatch.setattr(kernel_mod, "run", lambda *a, **k: out)
    assert kernel_mod.resolve_image_package([], "linux-image-cloud-amd64") == (
        "linux-image-6.1.0-57-cloud-amd64"
    )


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox not installed")
def test_init_script_parses() -> None:
    subprocess.run(["busybox", "sh", "-n", str(INIT_SCRIPT)], check=True)


def test_clean_tree_never_writes_through_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "host-machine-id"
    outside.write_text("keep\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "var/log/apt").mkdir(parents=True)
    (root / "var/log/apt/history.log").write_text("build noise")
    (root / "var/log/host").symlink_to(outside)
    (root / "etc/machine-id").symlink_to(outside)
    (root / "usr/share/doc/x").mkdir(parents=True)
    clean_tree(root, docs=True, locales=True)
    assert outside.read_text() == "keep\n"
    assert (root / "var/log/apt/history.log").read_text() == ""
    assert not (root / "usr/share/doc/x").exists()
    assert (root / "var/lib/apt/lists/partial").is_dir()


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="e2fsprogs not installed")
def test_pack_ext4_labels_a_sparse_image(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "opt").mkdir(parents=True)
    (tree / "opt/data").write_bytes(os.urandom(300_000))
    usage = tree_usage(tree)
    assert usage.inodes == 3 and usage.bytes >= 300_000
    image = tmp_path / "t.ext4"
    size = pack_ext4(tree, image, None, "aenv-test", lambda _m: None, journal=False)
    assert size == auto_size_mb(usage)
    assert image.stat().st_size == size * 2**20
    label = subprocess.run(["e2label", str(image)], capture_output=True, text=True, check=True)
    assert label.stdout.strip() == "aenv-test"
    assert image.stat().st_blocks * 512 < image.stat().st_size


def test_remove_tree(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    remove_tree(tmp_path / "a")
    assert not (tmp_path / "a").exists()


# --- a real microVM, booted by plain QEMU (tests/rawvm.py) ----------------------------


@pytest.mark.vm
def test_kit_boots_and_agent_answers(tmp_path: Path) -> None:
    if shutil.which("qemu-system-x86_64") is None or os.geteuid() != 0:
        pytest.skip("needs qemu-system-x86_64 and root (debootstrap, mkfs)")
    from agentenv.guest.kit import build_kit
    from agentenv.images.base import build_base_template

    cfg = load_config()
    kit = build_kit(cfg)
    base = build_base_template(cfg)
    for attempt in range(2):  # TCG early-boot stalls happen on busy hosts: retry once
        workdir = Path(tempfile.mkdtemp(dir=tmp_path))
        vm = RawVm(kit, base.rootfs, workdir)
        try:
            if not vm.wait_health(time.monotonic() + 90):
                if attempt == 0:
                    continue
                pytest.fail("agent /health never answered; console:\n" + "\n".join(vm.console))
            assert any("aenv: agent starting" in line for line in vm.console)
            assert not any("aenv: FATAL" in line for line in vm.console)
            init_agent(vm.port, vm.init_secret)
            code, out = run_command(vm.port, "/bin/sh", ["-c", "echo hello-$((6*7)); id -u"])
            assert code == 0, "\n".join(vm.console)
            assert "hello-42" in out
            return
        finally:
            vm.stop()
