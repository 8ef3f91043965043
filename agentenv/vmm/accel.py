"""Choose the accelerator: KVM when the host's KVM boots our kernel, TCG otherwise."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The kernel reaches this line on any working accelerator: with no initrd and no root
# disk it cannot mount root and panics, which `panic=-1` + `-no-reboot` turn into an exit.
_PROBE_MARKER = b"VFS: Unable to mount root fs"


@dataclass(frozen=True)
class AccelChoice:
    """The accelerator to use and a sentence saying why."""

    name: str  # "kvm" or "tcg"
    reason: str


def _kvm_usable() -> str | None:
    """Return why /dev/kvm cannot be used, or None if it can be opened."""
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm does not exist"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
    except OSError as exc:
        return f"/dev/kvm cannot be opened: {exc.strerror}"
    os.close(fd)
    return None


def is_pvm_host(sys_module: Path = Path("/sys/module")) -> bool:
    """PVM's KVM only boots PVM-enabled guest kernels; Debian's stock kernel hangs on it."""
    return (sys_module / "kvm_pvm").exists()


def probe_kvm(qemu: str, kernel: Path, timeout: float) -> bool:
    """Boot `kernel` under KVM with no root disk; True if it gets as far as the root mount."""
    cmd = [
        qemu, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128", "-smp", "1",
        "-nographic", "-nodefaults", "-no-reboot", "-serial", "stdio",
        "-kernel", str(kernel), "-append", "console=ttyS0 panic=-1 reboot=t",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False
    return _PROBE_MARKER in proc.stdout


def _cache_key(kernel: Path) -> str:
    digest = hashlib.sha256()
    digest.update(platform.node().encode())
    digest.update(platform.release().encode())
    digest.update(hashlib.sha256(kernel.read_bytes()).digest())
    return digest.hexdigest()[:16]


def choose_accel(
    mode: str, qemu: str, kernel: Path, cache_dir: Path, timeout: float
) -> AccelChoice:
    """Decide once per host and kernel, remembering the answer in `cache_dir`."""
    if mode == "tcg":
        return AccelChoice("tcg", "forced by vmm.accel = tcg")
    problem = _kvm_usable()
    if mode == "kvm":
        if problem:
            raise RuntimeError(f"vmm.accel = kvm but {problem}")
        return AccelChoice("kvm", "forced by vmm.accel = kvm")
    if problem:
        return AccelChoice("tcg", f"{problem}; using software emulation (TCG)")
    if is_pvm_host():
        return AccelChoice(
            "tcg", "KVM here is PVM (kvm_pvm), which cannot boot the stock guest kernel; using TCG"
        )
    cache = cache_dir / f"accel-{_cache_key(kernel)}.json"
    try:
        data = json.loads(cache.read_text())
        return AccelChoice(data["name"], data["reason"] + " (remembered)")
    except (OSError, ValueError, KeyError):
        pass
    start = time.monotonic()
    if probe_kvm(qemu, kernel, timeout):
        choice = AccelChoice(
            "kvm", f"KVM booted the guest kernel in {time.monotonic() - start:.1f}s"
        )
    else:
        choice = AccelChoice("tcg", f"KVM did not boot the guest kernel within {timeout:.0f}s")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(choice)))
    tmp.replace(cache)
    return choice
