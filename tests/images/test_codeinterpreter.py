"""The code interpreter's image: keyed by its inputs, deno from npm checked by its
integrity hash, chroot mounts gone on every way out, and the real image's contents."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from agentenv.config import Config, load_config
from agentenv.guest.buildutil import KitBuildError, mounts_under
from agentenv.images import codeinterpreter
from agentenv.images.chroot import mounted
from agentenv.images.codeinterpreter import (
    JAVA_KERNEL_ARGV,
    build_code_interpreter,
    code_interpreter_version,
    load_code_interpreter,
)
from agentenv.images.npmfetch import check_integrity, extract_member, tarball_name


def _cfg(tmp_path: Path) -> Config:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    return cfg


def test_the_image_is_keyed_by_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(tmp_path)
    version = code_interpreter_version(cfg)
    directory = cfg.images_dir / "code-interpreter"
    directory.mkdir(parents=True)
    (directory / "rootfs.ext4").write_bytes(b"image")
    (directory / "manifest.json").write_text(json.dumps({"version": version}))
    found = load_code_interpreter(cfg)
    assert found is not None and found.version == version
    # Another package list is another image: the one built no longer matches.
    monkeypatch.setattr(codeinterpreter, "PIP_PACKAGES", ("numpy<2.4",))
    assert code_interpreter_version(cfg) != version
    assert load_code_interpreter(cfg) is None


def _npm_tarball(tmp_path: Path) -> tuple[Path, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"#!/bin/sh\necho deno\n"
        info = tarfile.TarInfo("package/deno")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path = tmp_path / tarball_name("@deno/linux-x64-glibc", "9.9.9")
    path.write_bytes(buf.getvalue())
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(buf.getvalue()).digest()).decode()
    return path, integrity


def test_an_npm_tarball_is_checked_against_its_integrity_and_unpacked(tmp_path: Path) -> None:
    tarball, integrity = _npm_tarball(tmp_path)
    assert tarball.name == "@deno+linux-x64-glibc-9.9.9.tgz"
    check_integrity(tarball, integrity, "deno")
    extract_member(tarball, "deno", tmp_path / "bin" / "deno")
    assert (tmp_path / "bin" / "deno").read_bytes() == b"#!/bin/sh\necho deno\n"
    assert (tmp_path / "bin" / "deno").stat().st_mode & 0o111
    with pytest.raises(KitBuildError, match="has no file"):
        extract_member(tarball, "missing", tmp_path / "x")
    with pytest.raises(KitBuildError, match="does not match"):
        check_integrity(tarball, "sha512-" + base64.b64encode(b"\0" * 64).decode(), "deno")
    assert not tarball.exists()  # a corrupt download is not kept for the next build
    with pytest.raises(KitBuildError, match="no sha512"):
        check_integrity(tmp_path / "bin" / "deno", "sha1-abc", "deno")


def test_chroot_mounts_are_gone_after_a_failed_step(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "resolv.conf").write_text("nameserver 192.0.2.1\n")
    with pytest.raises(RuntimeError, match="a step failed"), mounted(root) as chroot:
        assert {"proc", "sys", "dev"} <= {Path(m).name for m in mounts_under(root)}
        chroot.bind(tmp_path / "cache", "/var/cache/apt/archives")
        raise RuntimeError("a step failed")
    assert mounts_under(root) == []
    # The tree's own resolver is put back.
    assert (root / "etc" / "resolv.conf").read_text() == "nameserver 192.0.2.1\n"


def _read(image: Path, path: str) -> str:
    done = subprocess.run(
        ["debugfs", "-R", f"cat {path}", str(image)], capture_output=True, text=True, check=True
    )
    return done.stdout


def _ls(image: Path, path: str) -> list[str]:
    done = subprocess.run(
        ["debugfs", "-R", f"ls -p {path}", str(image)], capture_output=True, text=True, check=True
    )
    return [line.split("/")[5] for line in done.stdout.splitlines() if line.count("/") >= 6]


@pytest.mark.slow
def test_the_real_image_has_the_kernels_the_user_and_the_data_stack() -> None:
    """Built as `aenv kit build` builds it (at once when it is current)."""
    image = build_code_interpreter(load_config())
    rootfs = image.rootfs
    kernels = set(_ls(rootfs, "/usr/local/share/jupyter/kernels"))
    assert {"python3", "deno", "bash", "java"} <= kernels
    assert "ir" in _ls(rootfs, "/usr/share/jupyter/kernels")
    assert image.manifest["kernels"] == ["python3", "deno", "ir", "bash", "java"]
    deno = json.loads(_read(rootfs, "/usr/local/share/jupyter/kernels/deno/kernel.json"))
    assert deno["argv"][0] == "/usr/local/bin/deno" and deno["env"] == {"NO_COLOR": "1"}
    java = json.loads(_read(rootfs, "/usr/local/share/jupyter/kernels/java/kernel.json"))
    assert java["argv"] == JAVA_KERNEL_ARGV and java["interrupt_mode"] == "message"
    assert "user:x:1000:1000::/home/user:/bin/bash" in _read(rootfs, "/etc/passwd")
    assert _read(rootfs, "/etc/sudoers.d/user") == "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    site = _ls(rootfs, "/usr/local/lib/python3.11/dist-packages")
    [numpy] = [name for name in site if re.fullmatch(r"numpy-[\d.]+\.dist-info", name)]
    major, minor = (int(part) for part in numpy.split("-")[1].split(".")[:2])
    assert (major, minor) < (2, 4)  # 2.4 dies of SIGILL under TCG
    for package in ("pandas", "matplotlib", "sklearn", "scipy", "seaborn", "ipykernel"):
        assert package in site
    assert "EXTERNALLY-MANAGED" not in _ls(rootfs, "/usr/lib/python3.11")
    assert "deno" in _ls(rootfs, "/usr/local/bin")
