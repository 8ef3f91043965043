"""A microVM booted by plain QEMU with user-mode networking: the kit alone, no aenv stack."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from agentenv.guest.agent import init_secret
from agentenv.guest.kit import guest_args
from agentenv.runtime.machine.bootsnap import INIT_SECRET_FILE, write_init_secret
from agentenv.vmm.qemucommand import FIRMWARE, host_tsc_khz, kernel_args

from .live import free_port


def _envelope(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def init_agent(port: int, secret: str) -> None:
    """`/init` as the manager sends it: the agent attaches the user's disk only then."""
    body = json.dumps({"envVars": {}}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/init",
        data=body,
        headers={"Content-Type": "application/json", init_secret.HEADER: secret},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as response:
        assert response.status == 204


def run_command(port: int, cmd: str, args: list[str]) -> tuple[int | None, str]:
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


class RawVm:
    """One QEMU microVM booting the kit with a qcow2 overlay of the base template."""

    def __init__(self, kit, rootfs: Path, workdir: Path, memory_mb: int = 512) -> None:
        self.port = free_port()
        # The host's /init secret reaches the guest through fw_cfg, as a sandbox's does.
        self.init_secret = write_init_secret(workdir)
        overlay = workdir / "overlay.qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", rootfs, overlay],
            check=True,
        )
        # User-mode networking has its own guest subnet; tsc_early_khz avoids TCG stalls.
        cmdline = kernel_args("tcg", guest_args("10.0.2.15", 24, "10.0.2.2"), host_tsc_khz())
        fwd = f"hostfwd=tcp:127.0.0.1:{self.port}-10.0.2.15:49983"
        argv = [
            "qemu-system-x86_64", "-M", "microvm,acpi=on", "-accel", "tcg,tb-size=64",
            "-m", str(memory_mb), "-bios", FIRMWARE,
            "-smp", "1", "-nographic", "-nodefaults", "-no-reboot", "-serial", "stdio",
            "-kernel", kit.kernel, "-initrd", kit.initrd, "-append", cmdline,
            "-drive", f"id=rt,file={kit.runtime_disk},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=rt",
            "-drive", f"id=root,file={overlay},format=qcow2,if=none",
            "-device", "virtio-blk-device,drive=root",
            "-netdev", f"user,id=n0,{fwd}", "-device", "virtio-net-device,netdev=n0",
            "-fw_cfg", f"name={init_secret.FW_CFG_NAME},file={workdir / INIT_SECRET_FILE}",
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
