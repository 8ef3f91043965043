"""The code interpreter's root filesystem: Debian with Jupyter kernels, like E2B's template.

Built on the host from Debian packages, PyPI and npm only: the base template's tree plus
Python's data stack, Jupyter and kernels for Python, JavaScript/TypeScript (deno), R,
bash and Java. The node turns it into the `code-interpreter-v1` template by adding the
execution service and snapshotting it started (`runtime/node/interpreter.py`). Keyed by
its inputs, so it is rebuilt only when they change; downloads are kept between builds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.buildutil import KitBuildError, Progress, locked, remove_tree, step
from agentenv.guest.debootstrap import clean_tree, debootstrap
from agentenv.guest.ext4 import auto_size_mb, pack_ext4, tree_usage
from agentenv.guest.kit import ROOTFS_LABEL
from agentenv.images.base import BASE_PACKAGES, UID, USER, configure_tree
from agentenv.images.builtimage import ROOTFS, current_manifest, inputs_version, publish
from agentenv.images.chroot import Chroot, mounted
from agentenv.images.npmfetch import extract_member, fetch_package

__all__ = [
    "CodeInterpreterImage",
    "build_code_interpreter",
    "code_interpreter_version",
    "load_code_interpreter",
]

# Bump when the builder's output changes for the same inputs.
FORMAT = 1
APT_PACKAGES = (
    "nodejs",
    "r-base-core",
    "r-cran-irkernel",
    "build-essential",
    "python3-dev",
    "pkg-config",
    "openjdk-17-jdk-headless",
    "unzip",
    "zip",
    "jq",
)
# Installed system-wide, as in E2B's image. numpy 2.4 dies of SIGILL on QEMU TCG's
# default CPU model (measured), so it stays below.
PIP_PACKAGES = (
    "jupyter_client",
    "ipykernel",
    "aiohttp",
    "bash_kernel",
    "jjava",
    "numpy<2.4",
    "pandas",
    "matplotlib",
    "seaborn",
    "scikit-learn",
    "scipy",
    "plotly",
    "openpyxl",
    "requests",
    "beautifulsoup4",
    "pillow",
    "sympy",
)
DENO = ("@deno/linux-x64-glibc", "2.9.6")
# Kernel names as E2B's SDKs ask for them (`language` picks one): java only if its
# PyPI package installed one.
KERNELS = ("python3", "deno", "ir", "bash", "java")
REQUIRED_KERNELS = ("python3", "deno", "ir", "bash")
# Room left on the disk for what users write, beyond what the tree uses.
FREE_MB = 1024
# jjava's kernel without its launcher (a JVM that only starts the kernel's JVM with these
# options): one JVM start instead of two, and that one with the C1 compiler alone, which
# under QEMU's software emulation spends far less of a start compiling.
JAVA_KERNEL_ARGV = [
    "java",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:-UsePerfData",
    "--add-opens",
    "jdk.jshell/jdk.jshell=ALL-UNNAMED",
    "-jar",
    "{resource_dir}/jjava.jar",
    "{connection_file}",
]
DENO_KERNEL = {
    "argv": ["/usr/local/bin/deno", "jupyter", "--kernel", "--conn", "{connection_file}"],
    "display_name": "Deno",
    "language": "typescript",
    # Plain results, as E2B's: deno colours a value's text/plain form otherwise.
    "env": {"NO_COLOR": "1"},
}
# Imported once at build time, so the first sandbox finds font and bytecode caches made.
SMOKE_IMPORTS = "import numpy, pandas, scipy, sklearn, seaborn, matplotlib.pyplot, ipykernel"


@dataclass(frozen=True)
class CodeInterpreterImage:
    """The built root filesystem (ext4, label aenv-rootfs), its version and manifest."""

    rootfs: Path
    version: str
    manifest: dict[str, object]


def image_dir(cfg: Config) -> Path:
    return cfg.images_dir / "code-interpreter"


def downloads_dir(cfg: Config) -> Path:
    """Packages kept between builds (apt's .debs, wheels, npm tarballs)."""
    return image_dir(cfg) / "cache" / "downloads"


def code_interpreter_inputs(cfg: Config) -> dict[str, object]:
    """Everything the image's content depends on."""
    return {
        "format": FORMAT,
        "mirror": cfg.kit.mirror,
        "suite": cfg.kit.suite,
        "base_packages": list(BASE_PACKAGES),
        "apt_packages": list(APT_PACKAGES),
        "pip_packages": list(PIP_PACKAGES),
        "deno": list(DENO),
        "deno_kernel": DENO_KERNEL,
        "java_kernel": JAVA_KERNEL_ARGV,
        "kernels": list(KERNELS),
        "user": [USER, UID],
        "min_size_mb": cfg.sandbox.disk_size_mb,
    }


def code_interpreter_version(cfg: Config) -> str:
    return inputs_version(code_interpreter_inputs(cfg))


def load_code_interpreter(cfg: Config) -> CodeInterpreterImage | None:
    """The built image if it matches the current inputs, else None."""
    directory, version = image_dir(cfg), code_interpreter_version(cfg)
    manifest = current_manifest(directory, version)
    if manifest is None:
        return None
    return CodeInterpreterImage(directory / ROOTFS, version, manifest)


def build_code_interpreter(
    cfg: Config, *, force: bool = False, progress: Progress = print
) -> CodeInterpreterImage:
    """Build `images_dir/code-interpreter/rootfs.ext4` unless it is current; returns it."""
    directory = image_dir(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    with locked(directory / ".build.lock"):
        current = load_code_interpreter(cfg)
        if current is not None and not force:
            progress(f"code interpreter image {current.version} is up to date in {directory}")
            return current
        version = code_interpreter_version(cfg)
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=directory))
        try:
            tree = work / "rootfs"
            debootstrap(tree, BASE_PACKAGES, cfg, progress)
            with step(progress, "configuring the user"):
                configure_tree(tree)
            kernels = install_stack(tree, cfg, progress)
            with step(progress, "cleaning the tree"):
                strip_tree(tree)
            used_mb = tree_usage(tree).bytes // 2**20
            size = max(cfg.sandbox.disk_size_mb, auto_size_mb(tree_usage(tree)) + FREE_MB)
            image = work / "rootfs.ext4"
            pack_ext4(tree, image, size, ROOTFS_LABEL, progress)
            manifest: dict[str, object] = {
                "version": version,
                "inputs": code_interpreter_inputs(cfg),
                "kernels": kernels,
                "size_mb": size,
                "used_mb": used_mb,
                "build_seconds": round(time.monotonic() - t0, 1),
                "built_at": time.time(),
            }
            rootfs = publish(directory, image, manifest, work)
        finally:
            remove_tree(work)
        progress(
            f"code interpreter image {version} built in {time.monotonic() - t0:.0f}s "
            f"({used_mb} MiB used, kernels: {', '.join(kernels)})"
        )
        return CodeInterpreterImage(rootfs, version, manifest)


def install_stack(tree: Path, cfg: Config, progress: Progress) -> list[str]:
    """Install packages, wheels, deno and kernel specs into `tree`; the kernels it has."""
    downloads = downloads_dir(cfg)
    with mounted(tree) as chroot:
        with step(progress, f"apt: installing {len(APT_PACKAGES)} packages and dependencies"):
            (downloads / "apt" / "partial").mkdir(parents=True, exist_ok=True)
            chroot.bind(downloads / "apt", "/var/cache/apt/archives")
            chroot.run("apt-get update", ["apt-get", "update", "-q"])
            chroot.run(
                "apt-get install",
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
            )
        with step(progress, f"pip: installing {len(PIP_PACKAGES)} packages system-wide"):
            install_wheels(chroot, downloads / "wheels")
        with step(progress, f"deno {DENO[1]} from npm"):
            tarball = fetch_package(*DENO, downloads / "npm")
            extract_member(tarball, "deno", tree / "usr/local/bin/deno")
            chroot.run("deno --version", ["/usr/local/bin/deno", "--version"])
        with step(progress, "kernel specs"):
            kernels = install_kernels(chroot)
        with step(progress, "warming caches (bytecode, matplotlib fonts)"):
            user_env = {"HOME": f"/home/{USER}"}
            argv = ["runuser", "-u", USER, "--", "python3", "-c", SMOKE_IMPORTS]
            chroot.run("import the data stack", argv, env=user_env)
    return kernels


def install_wheels(chroot: Chroot, wheels: Path) -> None:
    """pip for the whole system: PEP 668's marker goes, as E2B's image has none."""
    for marker in chroot.root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    spool = "/tmp/aenv-wheels"
    chroot.bind(wheels, spool)
    pip = ["python3", "-m", "pip", "--disable-pip-version-check", "--no-cache-dir"]
    # Resolved against PyPI, fetched into the kept spool, then installed from it alone.
    download = [*pip, "download", "-q", "-d", spool, *PIP_PACKAGES]
    chroot.run("pip download", download, env=chroot.download_env())
    install = ["install", "-q", "--root-user-action=ignore", "--no-index", "--find-links", spool]
    chroot.run("pip install", [*pip, *install, *PIP_PACKAGES])


def install_kernels(chroot: Chroot) -> list[str]:
    """Kernel specs under /usr/local/share/jupyter; the names Jupyter then lists."""
    prefix = ["--prefix", "/usr/local"]
    chroot.run("python kernel", ["python3", "-m", "ipykernel", "install", *prefix])
    chroot.run("bash kernel", ["python3", "-m", "bash_kernel.install", *prefix])
    deno = chroot.root / "usr/local/share/jupyter/kernels/deno"
    deno.mkdir(parents=True, exist_ok=True)
    (deno / "kernel.json").write_text(json.dumps(DENO_KERNEL, indent=1) + "\n")
    # Debian's r-cran-irkernel and PyPI's jjava bring their own specs.
    listed = chroot.run("list kernels", ["jupyter", "kernelspec", "list", "--json"])
    names = sorted(json.loads(listed)["kernelspecs"])
    missing = [k for k in REQUIRED_KERNELS if k not in names]
    if missing:
        raise KitBuildError(f"code interpreter: kernels missing: {', '.join(missing)}")
    java = chroot.root / "usr/local/share/jupyter/kernels/java/kernel.json"
    if "java" in names and java.is_file():
        spec = json.loads(java.read_text())
        java.write_text(json.dumps(spec | {"argv": JAVA_KERNEL_ARGV}, indent=1) + "\n")
    return [k for k in KERNELS if k in names]


def strip_tree(tree: Path) -> None:
    """Drop apt state, pip's and root's caches and the build's temporary files."""
    clean_tree(tree, docs=False, locales=False)
    shutil.rmtree(tree / "debootstrap", ignore_errors=True)
    for rel in ("root/.cache", "tmp"):
        path = tree / rel
        if path.is_dir():
            shutil.rmtree(path)
    (tree / "tmp").mkdir(mode=0o1777)
    (tree / "tmp").chmod(0o1777)
    for sub in ("proc", "sys", "dev", "run"):
        (tree / sub).mkdir(exist_ok=True)
