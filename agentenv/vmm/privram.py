"""The library QEMU is started with when it maps a snapshot's RAM privately, so that the
pages its guest gives back return to the host (`privram.c` says how), and the check that
it took: QEMU holds that file read-only.

Built from source on first use with the host's C compiler; without one, clones keep the
pages their guests free (QEMU maps the file read-only itself and refuses to discard).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("privram.c")
# The environment variable naming the RAM file, read by the library.
RAM_VARIABLE = "AENV_PRIVATE_RAM"


def build(directory: Path) -> Path | None:
    """The library, compiled into `directory` unless a build of this source is there;
    None (and a warning) when it cannot be built."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = directory / f"privram-{digest}.so"
    if target.is_file():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: memory that clones' guests free stays with their VMMs")
        return None
    # The VMMs' control sockets live there too: as closed as QEMU's driver makes it.
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        log.warning("building %s failed: %s", SOURCE.name, done.stderr.strip()[-500:])
        return None
    partial.replace(target)
    return target


def environment(library: Path, ram: Path) -> dict[str, str]:
    """QEMU's environment: this process's, with the library preloaded for `ram`."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library), env.get("LD_PRELOAD", "")]))
    env[RAM_VARIABLE] = str(ram)
    return env


def held_read_only(pid: int, ram: Path) -> bool:
    """True when process `pid` holds `ram` open, and only read-only."""
    wanted = os.path.realpath(ram)
    found = False
    fds = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fds.iterdir())
    except OSError:
        return False
    for entry in entries:
        try:
            if os.readlink(entry) != wanted:
                continue
            info = (Path(f"/proc/{pid}/fdinfo") / entry.name).read_text()
        except OSError:
            continue
        flags = next(line.split()[1] for line in info.splitlines() if line.startswith("flags:"))
        if int(flags, 8) & os.O_ACCMODE != os.O_RDONLY:
            return False
        found = True
    return found
