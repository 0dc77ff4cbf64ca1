"""The suite's tiers (tests/tiers.py): every module has one, and a unit test cannot start a
process by accident."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tiers import MODULES, TIERS, UnitStartedAProcess
from wheelforge import _proc


def test_every_test_module_has_a_tier() -> None:
    names = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    assert sorted(names - set(MODULES)) == [], "give each a tier in tests/tiers.py's MODULES"
    assert sorted(set(MODULES) - names) == [], "tests/tiers.py names modules that are gone"
    assert set(MODULES.values()) <= set(TIERS)


def test_a_unit_test_cannot_start_a_process(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    with pytest.raises(UnitStartedAProcess, match=r"test_tiers\.py::test_a_unit_test_cannot_"
                       r"start_a_process is in the unit tier .* \['true'\]"):
        subprocess.run(["true"], check=True)
    with pytest.raises(UnitStartedAProcess, match="Mark it @pytest.mark.integration"):
        _proc.run(["true"])
    with pytest.raises(UnitStartedAProcess, match="os.posix_spawn"):
        os.posix_spawn("/bin/true", ["true"], {})
    with pytest.raises(UnitStartedAProcess, match="os.system"):
        os.system("true")


@pytest.mark.integration
def test_an_integration_test_can(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is None
    assert subprocess.run(["true"]).returncode == 0
    assert _proc.run(["true"]).returncode == 0
