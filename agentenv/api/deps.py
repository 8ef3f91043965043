"""What routes receive by dependency: the node runtime and its services."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..config import Config
from ..images.builder import TemplateBuilds
from ..images.catalog import TemplateCatalog
from ..images.pull import ImagePuller
from ..runtime.node.assembly import Node
from ..runtime.sandboxes.manager import SandboxManager
from ..runtime.snapshots.fork import SandboxForks
from ..runtime.snapshots.named import SandboxSnapshots
from ..runtime.snapshots.pause import SandboxPauses


def _node(request: Request) -> Node:
    node: Node = request.app.state.node
    return node


def _config(request: Request) -> Config:
    config: Config = request.app.state.config
    return config


def _manager(request: Request) -> SandboxManager:
    return _node(request).manager


def _forks(request: Request) -> SandboxForks:
    return _node(request).forks


def _pauses(request: Request) -> SandboxPauses:
    return _node(request).pauses


def _snapshots(request: Request) -> SandboxSnapshots:
    return _node(request).snapshots


def _catalog(request: Request) -> TemplateCatalog:
    return _node(request).catalog


def _puller(request: Request) -> ImagePuller:
    return _node(request).puller


def _builds(request: Request) -> TemplateBuilds:
    return _node(request).builds


NodeDep = Annotated[Node, Depends(_node)]
ConfigDep = Annotated[Config, Depends(_config)]
ManagerDep = Annotated[SandboxManager, Depends(_manager)]
ForksDep = Annotated[SandboxForks, Depends(_forks)]
PausesDep = Annotated[SandboxPauses, Depends(_pauses)]
SnapshotsDep = Annotated[SandboxSnapshots, Depends(_snapshots)]
CatalogDep = Annotated[TemplateCatalog, Depends(_catalog)]
PullerDep = Annotated[ImagePuller, Depends(_puller)]
BuildsDep = Annotated[TemplateBuilds, Depends(_builds)]
