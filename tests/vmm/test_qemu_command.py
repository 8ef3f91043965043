from __future__ import annotations

import os
from pathlib import Path

from agentenv.vmm.driver import DiskSpec, VmSpec
from agentenv.vmm.qemu import LOG_LIMIT, trim_log
from agentenv.vmm.qemucommand import build_command, host_tsc_khz
from agentenv.vmm.qemuimg import copy_sparse


def _spec(tmp_path: Path) -> VmSpec:
    return VmSpec(
        name="aenv-x",
        vcpus=2,
        memory_mb=256,
        kernel=Path("/k"),
        initrd=Path("/i"),
        disks=(DiskSpec(Path("/rt.ext4"), read_only=True), DiskSpec(Path("/u.qcow2"), "qcow2")),
        workdir=tmp_path,
        kernel_args="aenv.ip=1.2.3.4/30",
        netns="aenv-x",
        tap="tap0",
    )


def test_tcg_command_has_file_backed_ram_disks_and_nic(tmp_path: Path) -> None:
    cmd = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), 2445406)
    joined = " ".join(cmd)
    assert f"mem-path={tmp_path / 'memory'},share=on" in joined
    assert "memory-backend=ram" in joined
    assert "-accel tcg,tb-size=64" in joined
    assert "file=/rt.ext4,format=raw,if=none,readonly=on" in joined
    assert "file=/u.qcow2,format=qcow2,if=none,readonly=off" in joined
    assert "tap,id=net0,ifname=tap0" in joined
    assert "aenv.ip=1.2.3.4/30 tsc_early_khz=2445406" in cmd[cmd.index("-append") + 1]
    assert cmd[cmd.index("-smp") + 1] == "2"
    # QEMU's microvm firmware: SeaBIOS's disk set-up overwrote a 2 GiB guest's initrd.
    assert cmd[cmd.index("-bios") + 1] == "qboot.rom"
    # An APIC timer that runs in idle lets the guest stop its tick.
    assert cmd[cmd.index("-cpu") + 1] == "qemu64,+arat"


def test_guests_run_at_the_niceness_asked_for(tmp_path: Path) -> None:
    assert build_command("qemu-system-x86_64", "tcg", _spec(tmp_path))[0] == "qemu-system-x86_64"
    niced = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), nice=5)
    assert niced[:4] == ["nice", "-n", "5", "qemu-system-x86_64"]


def test_kvm_uses_host_cpu(tmp_path: Path) -> None:
    cmd = build_command("qemu-system-x86_64", "kvm", _spec(tmp_path))
    assert cmd[cmd.index("-accel") + 1] == "kvm"
    assert "host" in cmd
    assert "tsc_early_khz" not in cmd[cmd.index("-append") + 1]


def test_host_tsc_khz_needs_a_constant_tsc() -> None:
    info = (
        "processor\t: 0\ncpu MHz\t\t: 2445.406\nflags\t\t: fpu tsc constant_tsc\n\nprocessor: 1\n"
    )
    assert host_tsc_khz(info) == 2445406
    assert host_tsc_khz(info.replace("constant_tsc", "")) is None


def test_incoming_waits_for_a_saved_state_with_the_same_devices(tmp_path: Path) -> None:
    booted = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), 2445406)
    restored = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), 2445406, incoming=True)
    # Stopped once loaded: the runtime decides when the guest runs.
    assert restored[-3:] == ["-S", "-incoming", "defer"]
    # The same devices; only the initrd a booted guest has no more use for is left out.
    assert booted[-2:] == ["-initrd", "/i"]
    assert restored[:-3] == booted[:-2]


def test_a_clone_maps_the_snapshots_ram_privately(tmp_path: Path) -> None:
    base = tmp_path / "memory.base"
    cmd = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), incoming=True, ram_base=base)
    backend = cmd[cmd.index("-object") + 1]
    # Opened read-only, mapped copy-on-write: nothing the guest does reaches the file.
    assert backend.endswith(f"mem-path={base},share=off,readonly=on,rom=off,merge=off")


def test_copy_sparse_keeps_holes_and_bytes(tmp_path: Path) -> None:
    src, dest = tmp_path / "memory", tmp_path / "copy"
    with open(src, "wb") as fh:
        fh.truncate(64 * 2**20)
        for offset in (0, 5 * 2**20 + 123, 64 * 2**20 - 4096):
            fh.seek(offset)
            fh.write(os.urandom(4096))
    copy_sparse(src, dest)
    assert dest.read_bytes() == src.read_bytes()
    assert dest.stat().st_blocks * 512 < 2**20  # three small extents, not 64 MiB


def test_a_vmm_log_over_its_limit_is_cut_back_and_appends_go_after_the_cut(
    tmp_path: Path,
) -> None:
    log = tmp_path / "vmm.log"
    writer = open(log, "ab")  # as QEMU's stderr: appending
    writer.write(b"startup error\n" + b"spam\n" * (LOG_LIMIT // 5))
    writer.flush()
    trim_log(log)
    writer.write(b"after\n")
    writer.close()
    text = log.read_bytes()
    assert len(text) < LOG_LIMIT // 8
    assert text.startswith(b"startup error\n") and text.endswith(b"cut here]\nafter\n")
    small = tmp_path / "small.log"
    small.write_bytes(b"fine\n")
    trim_log(small)
    assert small.read_bytes() == b"fine\n"


def test_guest_pages_merge_across_sandboxes_only_when_asked(tmp_path: Path) -> None:
    """Merged pages let one guest time another's writes: off unless the operator says so."""
    default = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path))
    merged = build_command("qemu-system-x86_64", "tcg", _spec(tmp_path), merge_pages=True)
    assert default[default.index("-object") + 1].endswith(",merge=off")
    assert merged[merged.index("-object") + 1].endswith(",merge=on")
