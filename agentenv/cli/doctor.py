"""`aenv doctor`: check the host can run sandboxes, one line per check with a fix hint."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentenv.cli.client import ApiClient, ServerUnreachable
from agentenv.cli.context import CliError, Context
from agentenv.cli.host import load_cfg
from agentenv.config import Config

_PT_INTERP = 3


@dataclass(frozen=True)
class Check:
    """One result: a name, pass/fail, what was found, and how to fix a failure."""

    name: str
    ok: bool
    detail: str = ""
    hint: str = ""
    required: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        text = f"{mark}  {self.name}"
        if self.detail:
            text += f": {self.detail}"
        if not self.ok and self.hint:
            text += f" — fix: {self.hint}"
        return text


def _run(cmd: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def is_static_elf(path: Path) -> bool | None:
    """True if the ELF file has no PT_INTERP (static), None if it is not a readable ELF64."""
    try:
        with path.open("rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return None
            endian = "<" if head[5] == 1 else ">"
            phoff = struct.unpack_from(endian + "Q", head, 0x20)[0]
            phentsize, phnum = struct.unpack_from(endian + "HH", head, 0x36)
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return None
    for i in range(phnum):
        (p_type,) = struct.unpack_from(endian + "I", table, i * phentsize)
        if p_type == _PT_INTERP:
            return False
    return True


def check_tool(name: str, package: str, version_args: list[str] | None = None) -> Check:
    """A program on PATH, with the first line of its version output if asked."""
    path = shutil.which(name)
    if not path:
        return Check(name, False, "not found", f"apt-get install {package}")
    detail = path
    if version_args:
        try:
            out = _run([path, *version_args]).stdout.strip().splitlines()
            detail = f"{path} ({out[0]})" if out else path
        except (OSError, subprocess.TimeoutExpired):
            pass
    return Check(name, True, detail)


def check_busybox() -> Check:
    path = shutil.which("busybox")
    if not path:
        return Check("busybox", False, "not found", "apt-get install busybox-static")
    static = is_static_elf(Path(path).resolve())
    if static is False:
        return Check(
            "busybox", False, f"{path} is dynamically linked", "apt-get install busybox-static"
        )
    return Check("busybox", True, f"{path} (static)")


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "" if ok else f"running as uid {os.geteuid()}", "run as root (sudo)")


def check_tun() -> Check:
    ok = os.path.exists("/dev/net/tun")
    return Check(
        "/dev/net/tun", ok, "" if ok else "missing", "modprobe tun (or mknod /dev/net/tun c 10 200)"
    )


def check_netns() -> Check:
    name = f"aenv-doctor-{os.getpid()}"
    hint = "run as root on a host (or privileged container) that allows network namespaces"
    if not shutil.which("ip"):
        return Check("network namespaces", False, "`ip` not found", "apt-get install iproute2")
    try:
        added = _run(["ip", "netns", "add", name])
        if added.returncode != 0:
            return Check(
                "network namespaces", False, added.stderr.strip() or "ip netns add failed", hint
            )
        _run(["ip", "netns", "delete", name])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("network namespaces", False, str(exc), hint)
    return Check("network namespaces", True, "ip netns add/delete works")


def _load(module: str, func: str, cfg: Config) -> tuple[Any, str]:
    """Call `module.func(cfg)`; return (result, problem) with problem empty on success."""
    try:
        loader: Callable[[Config], Any] = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        return None, f"{module}.{func} not available ({exc})"
    try:
        return loader(cfg), ""
    except Exception as exc:
        return None, f"{func} failed: {exc}"


def check_kit(cfg: Config) -> tuple[Check, Any]:
    kit, problem = _load("agentenv.guest.kit", "load_kit", cfg)
    if kit is None:
        return Check("kit", False, problem or f"not built in {cfg.kit_dir}", "aenv kit build"), None
    version = getattr(kit, "version", "")
    return Check(
        "kit", True, f"{cfg.kit_dir} (version {version})" if version else str(cfg.kit_dir)
    ), kit


def check_base(cfg: Config) -> Check:
    base, problem = _load("agentenv.images.base", "load_base_template", cfg)
    if base is None:
        return Check(
            "base template", False, problem or f"not built in {cfg.images_dir}", "aenv kit build"
        )
    version = getattr(base, "version", "")
    where = str(getattr(base, "rootfs", cfg.images_dir))
    return Check("base template", True, f"{where} (version {version})" if version else where)


def check_accel(cfg: Config, kit: Any) -> Check:
    if kit is None:
        return Check(
            "accelerator", False, "unknown until the kit is built", "aenv kit build", False
        )
    from agentenv.vmm.accel import choose_accel

    try:
        choice = choose_accel(
            cfg.vmm.accel,
            cfg.vmm.qemu_binary,
            Path(kit.kernel),
            cfg.kit_dir,
            cfg.vmm.kvm_probe_timeout,
        )
    except (RuntimeError, OSError) as exc:
        return Check("accelerator", False, str(exc), "set vmm.accel = auto (or tcg)")
    return Check("accelerator", True, f"{choice.name} — {choice.reason}")


def check_boot_snapshots(cfg: Config, kit: Any) -> Check:
    name = "boot snapshots"
    if not cfg.sandbox.boot_snapshots:
        return Check(name, True, "off (sandbox.boot_snapshots = false): sandboxes boot")
    if kit is None:
        return Check(name, False, "none without a kit", "aenv kit build", required=False)
    from agentenv.runtime.machine.bootsnap import complete_snapshots
    from agentenv.vmm.qemu import qemu_version_name

    root = cfg.kit_dir / "boot-snapshots"
    found = complete_snapshots(root, kit.version, qemu_version_name(cfg.vmm.qemu_binary))
    if not found:
        detail = "none yet; the server builds one when it starts, and boots sandboxes until then"
        return Check(name, False, detail, "start the server and wait a minute", required=False)
    shapes = ", ".join(f"{m['vcpus']} vCPU/{m['memory_mb']} MiB" for m in found.values())
    return Check(name, True, f"sandboxes are restored, not booted ({shapes})")


def check_server(ctx: Context) -> Check:
    hint = "start it with `aenv server` (or make run)"
    try:
        creds = ctx.creds
    except CliError as exc:
        return Check("server", False, exc.message, "fix or re-run `aenv auth`", required=False)
    url = creds.url
    try:
        with ApiClient(url, creds.key, transport=ctx.transport) as api:
            resp = api.health()
    except (ServerUnreachable, httpx.HTTPError):
        return Check("server", False, f"{url} not reachable", hint, required=False)
    if resp.is_success:
        return Check("server", True, f"{url}/health → {resp.status_code}", required=False)
    return Check("server", False, f"{url}/health → {resp.status_code}", hint, required=False)


def run_checks(ctx: Context, cfg: Config) -> Iterator[Check]:
    """Yield each check as it completes (the KVM probe can take a while)."""
    yield check_root()
    yield check_tool(cfg.vmm.qemu_binary, "qemu-system-x86", ["--version"])
    yield check_tool("qemu-img", "qemu-utils", ["--version"])
    yield check_busybox()
    yield check_tool("debootstrap", "debootstrap")
    yield check_tool("mkfs.ext4", "e2fsprogs")
    yield check_tool("iptables", "iptables", ["--version"])
    yield check_tool("ip", "iproute2")
    yield check_tun()
    yield check_netns()
    kit_check, kit = check_kit(cfg)
    yield kit_check
    yield check_base(cfg)
    yield check_accel(cfg, kit)
    yield check_boot_snapshots(cfg, kit)
    yield check_server(ctx)


def cmd_doctor(ctx: Context, args: argparse.Namespace) -> int:
    """Print each check; exit 1 if a required one failed."""
    cfg = load_cfg(args.config)
    failed = False
    for check in run_checks(ctx, cfg):
        ctx.stdout.write(check.line() + "\n")
        ctx.stdout.flush()
        failed |= check.required and not check.ok
    return 1 if failed else 0
