"""`aenv kit build`: the kit, `base`, then the code interpreter's image unless skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentenv.guest import kit
from agentenv.images import base, codeinterpreter


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def recorder(name: str) -> Callable[..., None]:
        def build(cfg: object, *, force: bool = False, **kwargs: Any) -> None:
            calls.append(name)
            if "progress" in kwargs:
                kwargs["progress"]("apt ...")  # stamped with the time since the start

        return build

    monkeypatch.setattr(kit, "build_kit", recorder("kit"))
    monkeypatch.setattr(base, "build_base_template", recorder("base"))
    monkeypatch.setattr(codeinterpreter, "build_code_interpreter", recorder("code-interpreter"))
    return calls


def test_kit_build_builds_the_code_interpreters_image_last(
    cli: Callable[..., Any], built: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["kit", "build"], lambda request: None).code == 0
    assert built == ["kit", "base", "code-interpreter"]
    assert "[ 0:00] apt ..." in capsys.readouterr().out


def test_kit_build_can_skip_it(
    cli: Callable[..., Any], built: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["kit", "build", "--skip-code-interpreter"], lambda request: None).code == 0
    assert built == ["kit", "base"]
    assert "skipped" in capsys.readouterr().out
