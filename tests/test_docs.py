"""Documentation stays true to the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentenv.config import Config

ROOT = Path(__file__).resolve().parent.parent


def test_every_config_key_is_documented_with_its_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    cfg = Config()
    for section in dataclasses.fields(cfg):
        for key in dataclasses.fields(getattr(cfg, section.name)):
            assert f"| `{section.name}.{key.name}` |" in text, f"{section.name}.{key.name}"


def test_readme_quick_start_is_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "make run" in quick
    assert "make test" in quick
    assert "make test" in (ROOT / ".ci" / "run").read_text()
