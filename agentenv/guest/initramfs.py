"""Build the guest initramfs: busybox, the virtio modules and /init, as a gzip'd newc cpio."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from agentenv.guest.buildutil import KitBuildError, Progress, run, step
from agentenv.wire import ENVD_PORT

INIT_SCRIPT = Path(__file__).with_name("init.sh")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def render_init(script: Path) -> str:
    """The guest's /init with the agent's port filled in (`wire.ENVD_PORT`)."""
    return script.read_text().replace("@ENVD_PORT@", str(ENVD_PORT))


def find_static_busybox() -> Path:
    """The host's busybox, which must be static: the initramfs has no libc."""
    for cand in BUSYBOX_CANDIDATES:
        path = Path(cand)
        if path.exists():
            out = run("inspect busybox", ["file", "-L", path]) if shutil.which("file") else ""
            if "dynamically linked" in out:
                raise KitBuildError(f"initramfs: {path} is dynamic; install busybox-static")
            return path
    raise KitBuildError("initramfs: busybox not found; install busybox-static")


def populate(root: Path, modules: list[Path], busybox: Path) -> None:
    """Lay out the initramfs tree under `root`."""
    for sub in ("bin", "dev", "etc", "lib/modules", "proc", "sys", "rt", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.symlink("bin", root / "sbin")
    shutil.copyfile(busybox, root / "bin/busybox")
    os.chmod(root / "bin/busybox", 0o755)
    applets = run("busybox --list", [busybox, "--list"]).split()
    for applet in applets:
        if applet != "busybox" and "/" not in applet:
            os.symlink("busybox", root / "bin" / applet)
    for mod in modules:
        shutil.copyfile(mod, root / "lib/modules" / mod.name)
    order = "".join(f"{mod.stem}\n" for mod in modules)
    (root / "lib/modules/load-order").write_text(order)
    (root / "init").write_text(render_init(INIT_SCRIPT))
    os.chmod(root / "init", 0o755)
    # The kernel opens /dev/console for /init before anything is mounted.
    for name, major, minor in (("console", 5, 1), ("null", 1, 3)):
        os.mknod(root / "dev" / name, 0o600 | 0o020000, os.makedev(major, minor))


def build_initramfs(root: Path, out: Path, modules: list[Path], progress: Progress) -> None:
    """Create `out` (gzip'd cpio) from a fresh tree at `root`."""
    with step(progress, "building initramfs"):
        populate(root, modules, find_static_busybox())
        names = sorted(
            str(Path(dirpath, name).relative_to(root))
            for dirpath, dirnames, filenames in os.walk(root)
            for name in (*dirnames, *filenames)
        )
        listing = "".join(f"{n}\n" for n in names).encode()
        with open(out, "wb") as fh:
            cpio = subprocess.Popen(
                ["cpio", "--quiet", "-o", "-H", "newc", "--reproducible"],
                cwd=root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            gz = subprocess.Popen(["gzip", "-9", "-n"], stdin=cpio.stdout, stdout=fh)
            assert cpio.stdout is not None and cpio.stdin is not None
            cpio.stdout.close()
            cpio.stdin.write(listing)
            cpio.stdin.close()
            err = cpio.stderr.read() if cpio.stderr else b""
            if cpio.wait() != 0 or gz.wait() != 0:
                raise KitBuildError(f"initramfs: cpio/gzip failed: {err.decode(errors='replace')}")
    progress(f"initramfs: {out.stat().st_size / 1024:.0f} KiB")
