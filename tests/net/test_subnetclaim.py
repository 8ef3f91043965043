"""One node per sandbox subnet in a network namespace, and the claim ends with its holder."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.net.subnetclaim import SubnetTaken, claimed_subnet


def test_a_subnet_is_held_by_one_node_at_a_time(tmp_path: Path) -> None:
    with claimed_subnet("10.150.0.0/16", tmp_path):
        with pytest.raises(SubnetTaken, match=r"10\.150\.0\.0/16"):
            with claimed_subnet("10.150.0.0/16", tmp_path):
                pass
        with claimed_subnet("10.151.0.0/16", tmp_path):
            pass
    with claimed_subnet("10.150.0.0/16", tmp_path):
        pass
