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
    ("12.0a", "12.0a", "sm120a", {"sm_120a"}, set()),
    ("10.0a;12.0a+PTX", "10.0a;12.0a+PTX", "sm100asm120aptx", {"sm_100a", "sm_120a"},
     {"compute_120a"}),
    # torch's parser: spaces separate like ';', named sets expand
    ("  10.0   12.0 ", "10.0;12.0", "sm100sm120", {"sm_100", "sm_120"}, set()),
    ("Hopper", "9.0+PTX", "sm90ptx", {"sm_90"}, {"compute_90"}),
    ("Blackwell", "10.0;10.3;12.0;12.1+PTX", "sm100sm103sm120sm121ptx",
     {"sm_100", "sm_103", "sm_120", "sm_121"}, {"compute_121"}),
])
def test_parse(text: str, torch: str, lbl: str, sass: set[str], ptx: set[str]) -> None:
    archs = parse_arch_list(text)
    assert torch_arch_list(archs) == torch
    assert label(archs) == lbl
    assert expected_sass(archs) == sass
    assert expected_ptx(archs) == ptx


@pytest.mark.parametrize("bad", ["", "sm_120", "12", "12.0+ptx", "Bl4ckwell", "12.10"])
def test_bad(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_arch_list(bad)


def test_names() -> None:
    a = Arch(12, 0, "", True)
    assert (a.sm, a.compute, str(a)) == ("sm_120", "compute_120", "12.0+PTX")


@pytest.mark.parametrize(("typed", "meant"), [
    ("sm_120", "12.0"), ("sm120", "12.0"), ("SM_120", "12.0"), ("120", "12.0"), ("12", "12.0"),
    ("90", "9.0"), ("86", "8.6"), ("sm_90a", "9.0a"), ("100", "10.0"), ("10", "10.0"),
    ("compute_120", "12.0+PTX"), ("12.0+ptx", "12.0+PTX"), ("sm_120+PTX", "12.0+PTX"),
])
def test_what_people_type_gets_a_did_you_mean(typed: str, meant: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list(typed)
    assert exc.value.what == f"{typed!r} is not a CUDA architecture; did you mean '{meant}'?"
    assert exc.value.fix == f"--arch '{meant}'"


@pytest.mark.parametrize("text", ["", " ", ";", " ; , "])
def test_an_empty_list_is_an_error(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list(text)
    assert exc.value.what == "the CUDA architecture list is empty"


def test_an_unknown_arch_says_it_is_unknown() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("12.0;13.0")
    assert exc.value.what == "13.0 is not a known CUDA compute capability"
    assert "12.0" in exc.value.why and "sm_120" not in exc.value.why
    assert "nvidia-smi --query-gpu=compute_cap" in exc.value.fix


def test_family_specific_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("12.0f")
    assert exc.value.what == ("'12.0f' is a family-specific target (CUDA 12.9+), which "
                              "wheelforge does not build")
    assert "torch's extension builder" in exc.value.why and "Unknown CUDA arch" in exc.value.why
    assert exc.value.fix.startswith("use --arch 12.0")


def test_arch_specific_only_where_it_exists() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("8.6a")
    assert exc.value.what == "'8.6a': compute capability 8.6 has no arch-specific variant"
    assert exc.value.fix == "use --arch 8.6"


def test_a_detached_ptx_suffix_is_explained() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("12.0 +PTX")
    assert exc.value.what == "'+PTX' stands alone in '12.0 +PTX'"
    assert exc.value.fix == "write --arch '12.0+PTX'"


def test_native_is_refused() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_arch_list("native")
    assert exc.value.what == "'native' is not accepted as an architecture"


def test_arch_specific_minimum_cuda() -> None:
    from wheelforge.arch import min_cuda

    assert [min_cuda(a) for a in parse_arch_list("9.0;9.0a;12.0a")] == ["11.8", "12.0", "12.8"]
