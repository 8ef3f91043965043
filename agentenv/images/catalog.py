"""Templates a sandbox can start from, resolved by ID or alias."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..errors import NotFound
from .base import load_base_template


@dataclass(frozen=True)
class Template:
    template_id: str
    alias: str | None
    rootfs: Path
    rootfs_format: str


class TemplateCatalog:
    """Today: the built-in `base` template. Pulled images join it in the images issue."""

    def __init__(self, cfg: Config) -> None:
        self._cfg = cfg

    def resolve(self, name: str) -> Template:
        if name == "base":
            base = load_base_template(self._cfg)
            if base is not None:
                return Template("base", "base", base.rootfs, "raw")
            raise NotFound("template 'base' is not built yet: run `aenv kit build`")
        raise NotFound(f"template '{name}' not found")
