"""Guest kit: pure helpers (hashing, module order, cmdline) and one real microVM boot."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentenv.config import Config, NetConfig, load_config
from agentenv.guest import kernel as kernel_mod
from agentenv.guest.buildutil import KitBuildError, remove_tree
from agentenv.guest.debootstrap import clean_tree
from agentenv.guest.ext4 import auto_size_mb, pack_ext4, tree_usage
from agentenv.guest.initramfs import INIT_SCRIPT
from agentenv.guest.kernel import module_load_order, module_name
from agentenv.guest.kit import host_tsc_khz, kernel_cmdline, kit_version, parse_aenv_args

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


def test_kernel_cmdline_carries_network_for_init() -> None:
    line = kernel_cmdline(NetConfig(), hostname="box", extra=["lpj=1000"])
    assert "console=ttyS0" in line and "panic=-1" in line
    args = parse_aenv_args(line)
    assert args == {"ip": "169.254.0.21/30", "gw": "169.254.0.22", "hostname": "box"}
    assert line.endswith("lpj=1000")
    with pytest.raises(ValueError):
        kernel_cmdline(NetConfig(), hostname="two words")


def test_host_tsc_khz_needs_a_constant_tsc() -> None:
    info = "processor\t: 0\ncpu MHz\t\t: 2445.406\nflags\t\t: fpu constant_tsc nonstop_tsc\n\n"
    assert host_tsc_khz(info) == 2445406
    assert host_tsc_khz(info.replace("constant_tsc", "")) is None
    assert "tsc_early_khz=2445406" in kernel_cmdline(NetConfig(), tsc_khz=2445406)


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


# --- a real microVM -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _envelope(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def _run_command(port: int, cmd: str, args: list[str]) -> tuple[int | None, str]:
    """Start a process through the agent's Connect API; return (exit code, stdout)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/process.Process/Start",
        data=_envelope({"process": {"cmd": cmd, "args": args}}),
        headers={"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"},
        method="POST",
    )
    data = urllib.request.urlopen(req, timeout=60).read()
    stdout, code, pos = b"", None, 0
    while pos + 5 <= len(data):
        _flags, size = struct.unpack(">BI", data[pos : pos + 5])
        msg = json.loads(data[pos + 5 : pos + 5 + size])
        pos += 5 + size
        event = msg.get("event", {})
        if "data" in event and "stdout" in event["data"]:
            stdout += base64.b64decode(event["data"]["stdout"])
        if "end" in event:
            code = event["end"].get("exitCode", 0)
    return code, stdout.decode(errors="replace")


class _Vm:
    """One QEMU microVM booting the kit with a qcow2 overlay of the base template."""

    def __init__(self, kit, rootfs: Path, workdir: Path) -> None:
        self.port = _free_port()
        overlay = workdir / "overlay.qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, overlay],
            check=True,
        )
        # User-mode networking has its own guest subnet; tsc_early_khz avoids TCG stalls.
        net = NetConfig(guest_ip="10.0.2.15", guest_prefix=24, guest_gateway="10.0.2.2")
        cmdline = kernel_cmdline(net, tsc_khz=host_tsc_khz())
        fwd = f"hostfwd=tcp:127.0.0.1:{self.port}-10.0.2.15:49983"
        argv = [
            "qemu-system-x86_64", "-M", "microvm,acpi=on", "-accel", "tcg", "-m", "512",
            "-smp", "1", "-nographic", "-nodefaults", "-no-reboot", "-serial", "stdio",
            "-kernel", kit.kernel, "-initrd", kit.initrd, "-append", cmdline,
            "-drive", f"id=rt,file={kit.runtime_disk},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=rt",
            "-drive", f"id=root,file={overlay},format=qcow2,if=none",
            "-device", "virtio-blk-device,drive=root",
            "-netdev", f"user,id=n0,{fwd}", "-device", "virtio-net-device,netdev=n0",
        ]  # fmt: skip
        self.console: list[str] = []
        self.proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.console.append(line.decode(errors="replace").rstrip())

    def wait_health(self, deadline: float) -> bool:
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 204:
                        return True
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


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
        vm = _Vm(kit, base.rootfs, workdir)
        try:
            if not vm.wait_health(time.monotonic() + 90):
                if attempt == 0:
                    continue
                pytest.fail("agent /health never answered; console:\n" + "\n".join(vm.console))
            assert any("aenv: agent starting" in line for line in vm.console)
            assert not any("aenv: FATAL" in line for line in vm.console)
            code, out = _run_command(vm.port, "/bin/sh", ["-c", "echo hello-$((6*7)); id -u"])
            assert code == 0, "\n".join(vm.console)
            assert "hello-42" in out
            return
        finally:
            vm.stop()
