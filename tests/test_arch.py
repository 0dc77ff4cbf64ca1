from __future__ import annotations

import pytest

from wheelforge.arch import (
    Arch,
    expected_ptx,
    expected_sass,
    label,
    parse_arch_list,
    torch_arch_list,
)
from wheelforge.errors import ConfigError


@pytest.mark.parametrize(("text", "torch", "lbl", "sass", "ptx"), [
    ("12.0", "12.0", "sm120", {"sm_120"}, set()),
    ("12.0;10.0", "10.0;12.0", "sm100sm120", {"sm_100", "sm_120"}, set()),
    ("10.0, 12.0 12.0", "10.0;12.0", "sm100sm120", {"sm_100", "sm_120"}, set()),
    ("12.0+PTX", "12.0+PTX", "sm120ptx", {"sm_120"}, {"compute_120"}),
    ("9.0a", "9.0a", "sm90a", {"sm_90a"}, set()),
])
def test_parse(text: str, torch: str, lbl: str, sass: set[str], ptx: set[str]) -> None:
    archs = parse_arch_list(text)
    assert torch_arch_list(archs) == torch
    assert label(archs) == lbl
    assert expected_sass(archs) == sass
    assert expected_ptx(archs) == ptx


@pytest.mark.parametrize("bad", ["", "sm_120", "12", "12.0+ptx", "Blackwell", "12.10"])
def test_bad(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_arch_list(bad)


def test_names() -> None:
    a = Arch(12, 0, "", True)
    assert (a.sm, a.compute, str(a)) == ("sm_120", "compute_120", "12.0+PTX")
