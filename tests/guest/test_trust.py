"""The egress CA installed into a guest's root file system, as `/init` does it."""

from __future__ import annotations

import os
from pathlib import Path

from agentenv.guest.agent.rootfs import RootFS
from agentenv.guest.agent.trust import ANCHOR, trust

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_added_to_the_bundle_once_and_named_for_tools(tmp_path: Path) -> None:
    bundle = tmp_path / "etc/ssl/certs/ca-certificates.crt"
    bundle.parent.mkdir(parents=True)
    bundle.write_text("-----BEGIN CERTIFICATE-----\nsystem\n-----END CERTIFICATE-----")
    env = trust(RootFS(str(tmp_path)), PEM)
    trust(RootFS(str(tmp_path)), PEM)  # a second /init (a resumed or restored guest)
    held = bundle.read_text()
    assert held.startswith("-----BEGIN CERTIFICATE-----\nsystem") and held.count(PEM) == 1
    assert (tmp_path / ANCHOR.lstrip("/")).read_text() == PEM
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/etc/ssl/certs/ca-certificates.crt"
    assert env["NODE_EXTRA_CA_CERTS"] == ANCHOR


def test_a_symlinked_bundle_stays_inside_the_guest(tmp_path: Path) -> None:
    """An absolute link is the guest's path, never the agent's file of that name."""
    outside = tmp_path / "agent.crt"
    outside.write_text("agent's own\n")
    root = tmp_path / "root"
    (root / "etc/ssl/certs").mkdir(parents=True)
    os.symlink(str(outside), root / "etc/ssl/certs/ca-certificates.crt")
    trust(RootFS(str(root)), PEM)
    assert outside.read_text() == "agent's own\n"
    assert (root / str(outside).lstrip("/")).read_text() == PEM


def test_an_image_without_a_bundle_gets_one(tmp_path: Path) -> None:
    env = trust(RootFS(str(tmp_path)), PEM)
    assert (tmp_path / "etc/ssl/certs/ca-certificates.crt").read_text() == PEM
    assert env["CURL_CA_BUNDLE"] == "/etc/ssl/certs/ca-certificates.crt"
