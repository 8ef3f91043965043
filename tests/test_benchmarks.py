"""Every benchmark still imports: `make bench` is not in the suite, so a helper moved or
renamed in the tests would otherwise break it unnoticed."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(Path(__file__).parent.parent.joinpath("benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_imports(path: Path) -> None:
    module = importlib.import_module(f"benchmarks.{path.stem}")
    assert callable(module.main)
