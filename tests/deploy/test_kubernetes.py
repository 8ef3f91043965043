"""The Kubernetes manifests: rendered by kustomize and validated against Kubernetes' own
schemas (strict: no unknown fields), with settings the server really reads."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from agentenv.config import Config

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


@pytest.fixture(scope="module")
def resources() -> list[dict]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_every_resource_is_valid(resources: list[dict], version: str) -> None:
    for resource in resources:
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_kustomization_names_every_manifest(resources: list[dict]) -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    files = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == files
    kinds = {(r["kind"], r["metadata"]["name"]) for r in resources}
    assert {("Deployment", "aenv-control"), ("DaemonSet", "aenv-node")} <= kinds
    assert all(
        r["metadata"].get("namespace") == "aenv" for r in resources if r["kind"] != "Namespace"
    )


def test_settings_are_ones_the_server_reads(resources: list[dict]) -> None:
    known = {"AENV_API_KEY", "AENV_PORT", "AENV_HOME", "POSTGRES_PASSWORD"}
    for section in dataclasses.fields(Config):
        for key in dataclasses.fields(section.default_factory()):  # type: ignore[misc]
            known.add(f"AENV_{section.name}_{key.name}".upper())
    given: set[str] = set()
    for resource in resources:
        if resource["kind"] == "ConfigMap":
            given |= set(resource["data"])
        elif resource["kind"] == "Secret":
            given |= set(resource["stringData"])
        elif resource["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            for container in resource["spec"]["template"]["spec"]["containers"]:
                given |= {e["name"] for e in container.get("env", []) if e["name"] != "POD_IP"}
    assert given and given <= known, given - known
