"""Fetch the Debian guest kernel and the virtio modules the initramfs loads."""

from __future__ import annotations

import gzip
import lzma
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.buildutil import KitBuildError, Progress, run, step

# Modules the initramfs needs; their dependencies are added from modules.dep.
# qemu_fw_cfg carries the host's /init secret, out of band of the sandbox's network.
WANTED_MODULES = (
    "virtio_mmio",
    "virtio_blk",
    "virtio_net",
    "virtio_balloon",
    "virtio_rng",
    "qemu_fw_cfg",
)
# Sets of modules the agent loads only when a guest needs them, so no guest pays for them
# at boot; they live on the runtime disk. `nfs`: a sandbox mounts a volume (NFSv3 from the
# node).
ON_DEMAND_MODULES: dict[str, tuple[str, ...]] = {"nfs": ("nfsv3",)}


@dataclass(frozen=True)
class KernelFiles:
    """An unpacked kernel: vmlinuz, boot modules and each on-demand set in load order,
    and the release."""

    vmlinuz: Path
    modules: list[Path]
    on_demand: dict[str, list[Path]]
    release: str
    package: str


def _apt_options(state: Path) -> list[str]:
    """apt options for a private package index, so the host's sources and state stay untouched."""
    return [
        "-o", f"Dir::Etc::SourceList={state / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/nonexistent",
        "-o", f"Dir::State::Lists={state / 'lists'}",
        "-o", f"Dir::Cache={state / 'cache'}",
        "-o", "Debug::NoLocking=1",
        "-o", "APT::Sandbox::User=root",
    ]  # fmt: skip


def apt_update(cfg: Config, state: Path) -> list[str]:
    """Refresh the private index for the kit's mirror and suite; return the apt options."""
    for sub in ("lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    signed = f"[signed-by={keyring}] " if Path(keyring).exists() else ""
    (state / "sources.list").write_text(f"deb {signed}{cfg.kit.mirror} {cfg.kit.suite} main\n")
    opts = _apt_options(state)
    run("apt-get update (kernel index)", ["apt-get", *opts, "-q", "update"])
    return opts


def resolve_image_package(opts: list[str], package: str) -> str:
    """Follow a metapackage like linux-image-cloud-amd64 to the versioned image package."""
    out = run(f"apt-cache depends {package}", ["apt-cache", *opts, "depends", package])
    deps = [
        line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if line.strip().startswith("Depends:") and "linux-image-" in line
    ]
    if deps:
        return deps[0]
    if "vmlinuz" in package or package.count("-") >= 4:
        return package  # already a versioned image package
    raise KitBuildError(f"kernel: {package} depends on no linux-image package:\n{out}")


def module_load_order(wanted: tuple[str, ...] | list[str], modules_dep: str) -> list[str]:
    """modules.dep paths for `wanted` and their dependencies, each after what it needs."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in modules_dep.splitlines():
        if ":" not in line:
            continue
        path, rest = line.split(":", 1)
        deps[path] = rest.split()
        by_name[module_name(path)] = path
    order: list[str] = []

    def visit(path: str, stack: tuple[str, ...]) -> None:
        if path in order:
            return
        if path in stack:
            raise KitBuildError(f"kernel modules: dependency cycle at {path}")
        for dep in deps.get(path, []):
            visit(dep, (*stack, path))
        order.append(path)

    for name in wanted:
        if name not in by_name:
            raise KitBuildError(f"kernel modules: {name} not in modules.dep (built in?)")
        visit(by_name[name], ())
    return order


def module_name(path: str) -> str:
    """`kernel/drivers/net/virtio_net.ko.xz` -> `virtio_net` (dashes normalised)."""
    base = path.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def _decompress(src: Path, dest: Path) -> None:
    """Copy a module as a plain .ko: busybox insmod cannot read compressed ones."""
    if src.name.endswith(".ko.xz"):
        dest.write_bytes(lzma.decompress(src.read_bytes()))
    elif src.name.endswith(".ko.zst"):
        with open(dest, "wb") as out:
            subprocess.run(["zstd", "-dc", str(src)], stdout=out, check=True)
    elif src.name.endswith(".ko.gz"):
        dest.write_bytes(gzip.decompress(src.read_bytes()))
    else:
        shutil.copyfile(src, dest)


def fetch_kernel(cfg: Config, work: Path, dest: Path, progress: Progress) -> KernelFiles:
    """Download and unpack `cfg.kit.kernel_package`; put vmlinuz and plain .ko files in `dest`."""
    state = cfg.kit_dir / "cache" / "apt"
    with step(progress, f"downloading kernel ({cfg.kit.kernel_package})"):
        opts = apt_update(cfg, state)
        package = resolve_image_package(opts, cfg.kit.kernel_package)
        debs = work / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        run(f"apt-get download {package}", ["apt-get", *opts, "-q", "download", package], cwd=debs)
        found = sorted(debs.glob(f"{package}_*.deb"))
        if not found:
            raise KitBuildError(f"kernel: apt-get download left no {package}_*.deb in {debs}")
    with step(progress, f"unpacking {found[0].name}"):
        tree = work / "kernel-tree"
        run("dpkg -x kernel", ["dpkg-deb", "-x", found[0], tree])
        releases = sorted(p.name for p in (tree / "lib/modules").iterdir())
        if len(releases) != 1:
            raise KitBuildError(f"kernel: expected one module tree, found {releases}")
        release = releases[0]
        vmlinuz = tree / "boot" / f"vmlinuz-{release}"
        if not vmlinuz.exists():
            raise KitBuildError(f"kernel: {vmlinuz.name} missing from {package}")
        run("depmod", ["depmod", "-b", tree, release])
        moddir = tree / "lib/modules" / release
        modules_dep = (moddir / "modules.dep").read_text()
        order = module_load_order(WANTED_MODULES, modules_dep)
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(vmlinuz, dest / "vmlinuz")
        modules = [_unpacked(moddir, rel, dest) for rel in order]
        on_demand = {}
        for name, wanted in ON_DEMAND_MODULES.items():
            (dest / name).mkdir(exist_ok=True)
            extra = [p for p in module_load_order(wanted, modules_dep) if p not in order]
            on_demand[name] = [_unpacked(moddir, rel, dest / name) for rel in extra]
    progress(f"kernel {release}: modules {' '.join(m.stem for m in modules)}")
    return KernelFiles(dest / "vmlinuz", modules, on_demand, release, package)


def _unpacked(moddir: Path, rel: str, dest: Path) -> Path:
    out = dest / f"{module_name(rel)}.ko"
    _decompress(moddir / rel, out)
    return out
