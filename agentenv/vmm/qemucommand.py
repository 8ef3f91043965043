"""The QEMU command line of a `microvm` sandbox: devices, RAM mapping, accelerator, and
the kernel's arguments (pure, so it is unit-tested)."""

from __future__ import annotations

from pathlib import Path

from . import guestram
from .driver import VmSpec

# Unix socket paths must stay under 108 bytes, so control sockets live in a short
# directory of their own rather than in the (arbitrarily deep) work directory.
RUN_DIR = Path("/run/aenv")


def qmp_socket(name: str, run_dir: Path = RUN_DIR) -> Path:
    return run_dir / f"{name}.qmp"


# QEMU's minimal microvm firmware: SeaBIOS (the default) sets up disks where QEMU put the
# initrd of a guest with exactly 2 GiB, which then never boots (docs/snapshots.md).
FIRMWARE = "qboot.rom"
# TCG's CPU with ARAT, so that with no HPET either the guest stops its tick in idle.
TCG_CPU = "qemu64,+arat"


def host_tsc_khz(cpuinfo: str | None = None) -> int | None:
    """Host TSC rate in kHz (a TCG guest's TSC ticks at it), if the CPU says it is constant."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    first = cpuinfo.split("\n\n", 1)[0]
    fields = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in first.splitlines())
    }
    if "constant_tsc" not in fields.get("flags", "").split():
        return None
    try:
        return round(float(fields["cpu MHz"]) * 1000)
    except (KeyError, ValueError):
        return None


def kernel_args(accel: str, guest_args: str, tsc_khz: int | None) -> str:
    """Serial console, fail-fast panics, the guest's own arguments, and TCG's clock fix."""
    args = f"console=ttyS0 quiet panic=-1 reboot=t {guest_args}".strip()
    if accel == "tcg" and tsc_khz:
        # Under TCG the kernel cannot calibrate the TSC (no PIT/HPET reference) and often
        # stalls at boot; telling it the rate skips calibration (16/16 boots vs. 4/8 without).
        args += f" tsc_early_khz={tsc_khz} tsc=reliable"
    return args


def build_command(
    qemu: str,
    accel: str,
    spec: VmSpec,
    tsc_khz: int | None = None,
    run_dir: Path = RUN_DIR,
    *,
    incoming: bool = False,
    ram_base: Path | None = None,
    base_discards: bool = False,
    merge_pages: bool = False,
    translation_buffer_mb: int = 64,
    nice: int = 0,
) -> list[str]:
    """The full QEMU command line for `spec` (pure, so it is unit-tested).

    `incoming`: wait for a saved state instead of booting (the command line must describe
    the same devices as the VM that was saved), and stay stopped once it is loaded.
    `ram_base`: map this snapshot RAM file privately instead of the VM's own RAM file.
    `base_discards`: QEMU runs with `privram` preloaded, which keeps that file read-only.
    `merge_pages`: the host kernel may merge guest pages identical to other guests' (KSM).
    `nice`: QEMU runs at this niceness (its threads inherit it).
    """
    workdir = spec.workdir
    if ram_base is None:
        # Guest RAM lives in a file so that pause/snapshot never copies it.
        ram = f"mem-path={workdir / guestram.OWN},share=on"
    elif base_discards:
        # Copy-on-write: the pages no guest wrote stay shared with every other mapper, and
        # the pages it gives back are dropped from its private copy (`privram.c`).
        ram = f"mem-path={ram_base},share=off"
    else:
        # Without `privram`, QEMU opens the file read-only itself: a balloon discard (which
        # QEMU does by punching holes, even in a private mapping) fails instead of zeroing
        # pages under every clone.
        ram = f"mem-path={ram_base},share=off,readonly=on,rom=off"
    # Off unless asked: pages merged across sandboxes let one time another's writes.
    merge = f"merge={'on' if merge_pages else 'off'}"
    args = [
        *(["nice", "-n", str(nice)] if nice else []),
        qemu,
        "-name", spec.name,
        "-M", "microvm,acpi=on,memory-backend=ram",
        "-m", f"{spec.memory_mb}M",
        "-bios", FIRMWARE,
        "-smp", str(spec.vcpus),
        "-object", f"memory-backend-file,id=ram,size={spec.memory_mb}M,{ram},{merge}",
        "-nographic", "-nodefaults", "-no-reboot", "-no-user-config",
        "-serial", f"file:{workdir / 'console.log'}",
        "-qmp", f"unix:{qmp_socket(spec.name, run_dir)},server=on,wait=off",
        "-kernel", str(spec.kernel),
        "-append", kernel_args(accel, spec.kernel_args, tsc_khz),
        "-device", "virtio-balloon-device,deflate-on-oom=on,free-page-reporting=on",
    ]  # fmt: skip
    if accel == "kvm":
        args += ["-accel", "kvm", "-cpu", "host"]
    else:
        # A small translation cache keeps each idle VM's resident memory down.
        args += ["-accel", f"tcg,tb-size={translation_buffer_mb}", "-cpu", TCG_CPU]
    for index, disk in enumerate(spec.disks):
        readonly = "on" if disk.read_only else "off"
        args += [
            "-drive",
            f"id=disk{index},file={disk.path},format={disk.format},if=none,readonly={readonly}",
            "-device",
            f"virtio-blk-device,drive=disk{index}",
        ]
    if spec.tap:
        args += [
            "-netdev", f"tap,id=net0,ifname={spec.tap},script=no,downscript=no",
            "-device", f"virtio-net-device,netdev=net0,mac={spec.mac}",
        ]  # fmt: skip
    for name, path in spec.guest_files:
        # A file, not a string: the command line is readable by every host user.
        args += ["-fw_cfg", f"name={name},file={path}"]
    if incoming:
        # A restored guest is past its boot: it needs no initrd (QEMU would hold a copy).
        args += ["-S", "-incoming", "defer"]
    else:
        args += ["-initrd", str(spec.initrd)]
    return args
