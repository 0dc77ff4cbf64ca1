"""tests/workers.py: the groups `make test` sends to its two xdist workers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

import workers


@dataclass
class Item:
    """What order_for_workers reads of a pytest item."""

    nodeid: str
    fixturenames: tuple[str, ...] = ()


def _order(*items: Item) -> list[str]:
    listed = list(items)
    workers.order_for_workers(cast(list[Any], listed))
    return [i.nodeid for i in listed]


def test_a_module_is_a_group_and_the_shared_builds_join_theirs() -> None:
    assert workers.group_of("tests/test_faults.py::test_x[300 wheels]") == "test_faults"
    assert workers.group_of("tests/test_e2e_stack.py::test_y[pip]") == "upstream"
    assert workers.group_of("tests/test_e2e_flash_attn.py::test_z") == "upstream"
    assert workers.group_of("tests/test_reproducible.py::test_w") == "tinyext-cold"
    assert workers.group_of("tests/test_build_fixture.py::test_v") == "tinyext-cold"


def test_the_longest_groups_go_first_and_the_rest_keep_their_order() -> None:
    got = _order(Item("tests/test_a.py::t1"), Item("tests/test_reproducible.py::t2"),
                 Item("tests/test_b.py::t3"), Item("tests/test_e2e_stack.py::t4"),
                 Item("tests/test_a.py::t5"), Item("tests/test_e2e_causal_conv1d.py::t6"))
    assert got == ["tests/test_e2e_stack.py::t4", "tests/test_e2e_causal_conv1d.py::t6",
                   "tests/test_reproducible.py::t2", "tests/test_a.py::t1",
                   "tests/test_b.py::t3", "tests/test_a.py::t5"]


@pytest.mark.parametrize("fixture", ["upstream_stack", "tinyext_cold"])
def test_a_shared_build_asked_for_outside_its_group_is_refused(fixture: str) -> None:
    with pytest.raises(pytest.UsageError, match=rf"uses {fixture}: add its module to SHARED"):
        _order(Item("tests/test_elsewhere.py::t", (fixture,)))


def test_every_module_of_a_group_exists() -> None:
    here = Path(__file__).parent
    for modules, _ in workers.SHARED.values():
        assert all((here / f"{m}.py").is_file() for m in modules), modules
    for name in workers.FIRST:
        assert name in workers.SHARED or (here / f"{name}.py").is_file(), name
