"""The guest kit: kernel, initramfs and the shared read-only runtime disk with the agent.

Built once per set of inputs into `cfg.kit_dir/<version>/`; `cfg.kit_dir/manifest.json`
names the current version. Old versions stay (paused sandboxes may need them) until
`prune_kits`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.buildutil import (
    KitBuildError,
    Progress,
    hash_tree,
    locked,
    remove_tree,
    run,
    step,
)
from agentenv.guest.debootstrap import clean_tree, debootstrap
from agentenv.guest.ext4 import pack_ext4
from agentenv.guest.initramfs import INIT_SCRIPT, build_initramfs, render_init
from agentenv.guest.kernel import ON_DEMAND_MODULES, WANTED_MODULES, fetch_kernel

__all__ = [
    "Kit",
    "KitBuildError",
    "build_kit",
    "guest_args",
    "kit_version",
    "load_kit",
    "prune_kits",
]

# Bump when the builder's output changes for the same inputs.
KIT_FORMAT = 1
AGENT_SRC = Path(__file__).with_name("agent")
RUNTIME_LABEL = "aenv-runtime"
ROOTFS_LABEL = "aenv-rootfs"
RUNTIME_PACKAGES = ("python3", "python3-aiohttp")
# On the runtime disk; the agent's `kmod` module reads it.
AGENT_MODULES_DIR = "opt/aenv/modules"
RUNTIME_MOUNTPOINTS = ("rootfs", "proc", "sys", "dev", "tmp", "run")
KERNEL_NAME, INITRD_NAME, RUNTIME_NAME = "vmlinuz", "initrd.img", "runtime.ext4"


@dataclass(frozen=True)
class Kit:
    """Files a VMM needs to boot a sandbox, and the content hash that names them."""

    kernel: Path
    initrd: Path
    runtime_disk: Path
    version: str


def kit_inputs(cfg: Config) -> dict[str, object]:
    """Everything the kit's content depends on, besides the agent and init sources."""
    return {
        "format": KIT_FORMAT,
        "mirror": cfg.kit.mirror,
        "suite": cfg.kit.suite,
        "kernel_package": cfg.kit.kernel_package,
        "modules": list(WANTED_MODULES),
        "on_demand_modules": {k: list(v) for k, v in ON_DEMAND_MODULES.items()},
        "runtime_packages": list(RUNTIME_PACKAGES),
    }


def kit_version(
    cfg: Config, *, init_script: Path = INIT_SCRIPT, agent_src: Path = AGENT_SRC
) -> str:
    """Content hash of all kit inputs: config, package lists, init script, agent sources."""
    h = hashlib.sha256(json.dumps(kit_inputs(cfg), sort_keys=True).encode())
    h.update(b"init\0" + render_init(init_script).encode())
    if agent_src.is_dir():
        hash_tree(h, agent_src, "agent")
    return h.hexdigest()[:16]


def guest_args(
    ip: str, prefix: int, gateway: str, *, hostname: str | None = None, dns: str | None = None
) -> str:
    """The `aenv.*` kernel arguments the kit's /init reads (network, hostname, DNS)."""
    args = [f"aenv.ip={ip}/{prefix}", f"aenv.gw={gateway}"]
    if hostname:
        args.append(f"aenv.hostname={hostname}")
    if dns:
        args.append(f"aenv.dns={dns}")
    for arg in args:
        if any(c.isspace() for c in arg):
            raise ValueError(f"bad kernel argument {arg!r}")
    return " ".join(args)


def parse_aenv_args(cmdline: str) -> dict[str, str]:
    """The aenv.* arguments of a kernel command line, as /init reads them."""
    out = {}
    for arg in cmdline.split():
        key, sep, value = arg.partition("=")
        if sep and key.startswith("aenv."):
            out[key.removeprefix("aenv.")] = value
    return out


def _kit_from_dir(directory: Path, version: str) -> Kit:
    return Kit(
        kernel=directory / KERNEL_NAME,
        initrd=directory / INITRD_NAME,
        runtime_disk=directory / RUNTIME_NAME,
        version=version,
    )


def load_kit(cfg: Config, version: str | None = None) -> Kit | None:
    """The built kit matching the current inputs (or `version`: one a paused sandbox still
    runs on), or None if it is not built."""
    version = version or kit_version(cfg)
    directory = cfg.kit_dir / version
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    kit = _kit_from_dir(directory, version)
    if manifest.get("version") != version:
        return None
    if not all(p.is_file() for p in (kit.kernel, kit.initrd, kit.runtime_disk)):
        return None
    return kit


def build_kit(cfg: Config, *, force: bool = False, progress: Progress = print) -> Kit:
    """Build the kit unless one for the same inputs exists; returns it either way."""
    cfg.kit_dir.mkdir(parents=True, exist_ok=True)
    with locked(cfg.kit_dir / ".build.lock"):
        kit = load_kit(cfg)
        if kit is not None and not force:
            progress(f"kit {kit.version} is up to date in {cfg.kit_dir}")
            return kit
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=cfg.kit_dir))
        try:
            # Hash and build from one snapshot, so edits made meanwhile cannot mislabel the kit.
            agent = work / "agent-src"
            _copy_agent(AGENT_SRC, agent)
            version = kit_version(cfg, agent_src=agent)
            out = work / "out"
            out.mkdir()
            manifest = _build_into(cfg, work, out, agent, progress, force=force)
            manifest.update(version=version, inputs=kit_inputs(cfg), built_at=time.time())
            (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            final = cfg.kit_dir / version
            if final.exists():
                shutil.rmtree(final)
            os.rename(out, final)
            current = cfg.kit_dir / "manifest.json"
            tmp = current.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"version": version, "dir": version}, indent=2) + "\n")
            os.replace(tmp, current)
        finally:
            remove_tree(work)
        progress(f"kit {version} built in {time.monotonic() - t0:.1f}s: {final}")
        if kit_version(cfg) != version:
            progress("note: agent sources changed during the build; build again to pick them up")
        return _kit_from_dir(final, version)


def _copy_agent(src: Path, dest: Path) -> None:
    if not src.is_dir():
        raise KitBuildError(f"runtime: agent sources missing at {src}")
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _build_into(
    cfg: Config, work: Path, out: Path, agent: Path, progress: Progress, *, force: bool
) -> dict[str, object]:
    inputs = kit_inputs(cfg)
    kernel_key = _key(
        inputs, "format", "mirror", "suite", "kernel_package", "modules", "on_demand_modules"
    )
    kdir = _cached_stage(cfg, "kernel", kernel_key, force, progress, _kernel_stage(cfg, progress))
    info = json.loads((kdir / "kernel.json").read_text())
    shutil.copyfile(kdir / KERNEL_NAME, out / KERNEL_NAME)
    modules = [kdir / f"{name}.ko" for name in info["modules"]]
    build_initramfs(work / "initramfs", out / INITRD_NAME, modules, progress)

    rt_key = _key(inputs, "format", "mirror", "suite", "runtime_packages")
    rdir = _cached_stage(cfg, "runtime", rt_key, force, progress, _runtime_stage(cfg, progress))
    tree = work / "runtime"
    with step(progress, "installing agent into runtime tree"):
        run("copy runtime tree", ["cp", "-a", rdir / "tree", tree])
        install_agent(tree, agent)
        for name, stems in info["on_demand"].items():
            install_modules(tree, name, [kdir / name / f"{stem}.ko" for stem in stems])
    size = pack_ext4(tree, out / RUNTIME_NAME, None, RUNTIME_LABEL, progress, journal=False)
    return {
        "kernel_release": info["release"],
        "kernel_image_package": info["package"],
        "modules": info["modules"],
        "runtime_size_mb": size,
        "files": {"kernel": KERNEL_NAME, "initrd": INITRD_NAME, "runtime_disk": RUNTIME_NAME},
    }


def _key(inputs: dict[str, object], *names: str) -> str:
    blob = json.dumps({n: inputs[n] for n in names}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _cached_stage(
    cfg: Config,
    name: str,
    key: str,
    force: bool,
    progress: Progress,
    build: Callable[[Path], None],
) -> Path:
    """A build stage's output under kit_dir/cache, rebuilt only when its own inputs change.

    Editing the agent then repacks the runtime disk without a new debootstrap.
    """
    cache = cfg.kit_dir / "cache"
    final = cache / f"{name}-{key}"
    if (final / ".complete").exists() and not force:
        progress(f"{name} stage {key}: cached")
        return final
    tmp = cache / f".{name}-{key}.tmp"
    remove_tree(tmp)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        (tmp / ".complete").touch()
        remove_tree(final)
        os.rename(tmp, final)
    finally:
        remove_tree(tmp)
    for old in cache.glob(f"{name}-*"):
        if old != final:
            remove_tree(old)
    return final


def _kernel_stage(cfg: Config, progress: Progress) -> Callable[[Path], None]:
    def build(dest: Path) -> None:
        kernel = fetch_kernel(cfg, dest / "work", dest, progress)
        remove_tree(dest / "work")
        info = {
            "release": kernel.release,
            "package": kernel.package,
            "modules": [m.stem for m in kernel.modules],
            "on_demand": {k: [m.stem for m in v] for k, v in kernel.on_demand.items()},
        }
        (dest / "kernel.json").write_text(json.dumps(info, indent=2) + "\n")
        if kernel.vmlinuz != dest / KERNEL_NAME:
            os.replace(kernel.vmlinuz, dest / KERNEL_NAME)

    return build


def _runtime_stage(cfg: Config, progress: Progress) -> Callable[[Path], None]:
    def build(dest: Path) -> None:
        tree = dest / "tree"
        debootstrap(tree, RUNTIME_PACKAGES, cfg, progress)
        strip_runtime_tree(tree)

    return build


def strip_runtime_tree(tree: Path) -> None:
    """Add mountpoints and drop what never runs on the read-only runtime disk."""
    clean_tree(tree, docs=True, locales=True)
    shutil.rmtree(tree / "debootstrap", ignore_errors=True)
    for sub in RUNTIME_MOUNTPOINTS:
        path = tree / sub
        if path.is_dir() and not path.is_symlink():
            # Whatever debootstrap left there is hidden by the mount at boot anyway.
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        path.mkdir(exist_ok=True)


def install_agent(tree: Path, agent_src: Path) -> None:
    """Copy the agent into /opt/aenv and byte-compile it with the guest's interpreter."""
    _copy_agent(agent_src, tree / "opt/aenv/aenv_agent")
    # unchecked-hash pycs never stat their source, which suits a read-only disk.
    run(
        "byte-compile agent",
        ["chroot", tree, "/usr/bin/python3", "-m", "compileall", "-q", "--invalidation-mode",
         "unchecked-hash", "/opt/aenv"],
    )  # fmt: skip


def install_modules(tree: Path, name: str, modules: list[Path]) -> None:
    """A set of modules the agent loads on demand, in /opt/aenv/modules/<name> with their
    load order (`guest/agent/kmod.py`)."""
    dest = tree / AGENT_MODULES_DIR / name
    dest.mkdir(parents=True, exist_ok=True)
    for module in modules:
        shutil.copyfile(module, dest / module.name)
    (dest / "load-order").write_text("".join(f"{m.stem}\n" for m in modules))


def prune_kits(cfg: Config, keep: Iterable[str] = ()) -> list[Path]:
    """Delete built kit versions except the current one and `keep` (say, those that paused
    sandboxes still need); returns what was removed."""
    wanted = {kit_version(cfg), *keep}
    removed = []
    with locked(cfg.kit_dir / ".build.lock"):
        for manifest in sorted(cfg.kit_dir.glob("*/manifest.json")):
            if manifest.parent.name not in wanted:
                shutil.rmtree(manifest.parent)
                removed.append(manifest.parent)
    return removed


def describe(kit: Kit) -> dict[str, object]:
    """A JSON-friendly view of a kit, for the CLI."""
    return {k: str(v) for k, v in asdict(kit).items()}
