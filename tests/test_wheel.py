from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from wheelforge.wheel import (
    inspect_wheel,
    interpreter_fits,
    read_metadata,
    record_problems,
    relabel,
)

META = "Requires-Dist: torch\nRequires-Dist: packaging\nRequires-Dist: ninja\n" \
       "Requires-Python: >=3.9\n"


def test_relabel(wheel_factory: Callable[..., Path], tmp_path: Path) -> None:
    src = wheel_factory({"causal_conv1d/__init__.py": "x = 1\n", "cc_cuda.so": b"\x7fELF"},
                        name="causal-conv1d", version="1.7.0", tag="cp311-cp311-linux_x86_64",
                        metadata_extra=META)
    out = relabel(src, tmp_path / "out", local="cu130torch2.14sm120", torch_pin="==2.14.*",
                  drop_requires=["ninja"])
    assert out.name == "causal_conv1d-1.7.0+cu130torch2.14sm120-cp311-cp311-linux_x86_64.whl"
    info = inspect_wheel(out)
    assert info.dist_info == "causal_conv1d-1.7.0+cu130torch2.14sm120.dist-info"
    assert record_problems(out) == []
    meta = read_metadata(out).decode()
    assert "Version: 1.7.0+cu130torch2.14sm120\n" in meta
    assert "Requires-Dist: torch==2.14.*\n" in meta
    assert "ninja" not in meta
    assert "Requires-Dist: packaging\n" in meta
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
    assert names[-1].endswith(".dist-info/RECORD")
    assert src.exists()  # input untouched


def test_relabel_adds_missing_torch_pin(wheel_factory: Callable[..., Path], tmp_path: Path) -> None:
    src = wheel_factory({"m.py": ""}, name="demo", version="1.0", tag="cp311-cp311-linux_x86_64")
    out = relabel(src, tmp_path / "o", local="", torch_pin="==2.14.*")
    assert out.name == "demo-1.0-cp311-cp311-linux_x86_64.whl"
    assert "Requires-Dist: torch==2.14.*" in read_metadata(out).decode()


def test_record_problems(wheel_factory: Callable[..., Path], tmp_path: Path) -> None:
    src = wheel_factory({"m.py": "a = 1\n"})
    bad = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            zout.writestr(item, b"a = 2\n" if item.filename == "m.py" else data)
        zout.writestr("extra.py", "")
    problems = record_problems(bad)
    assert "m.py: hash in RECORD does not match the file" in problems
    assert "extra.py is not listed in RECORD" in problems


@pytest.mark.parametrize(("tags", "python", "fits"), [
    ("cp311-cp311-linux_x86_64", "cp311", True),
    ("cp311-cp311-linux_x86_64", "cp312", False),
    ("cp310-abi3-manylinux_2_34_x86_64", "cp310", True),
    ("cp310-abi3-manylinux_2_34_x86_64", "cp312", True),   # the stable ABI: later ones too
    ("cp310-abi3-manylinux_2_34_x86_64", "cp39", False),
    ("cp312-abi3-manylinux_2_34_x86_64", "cp311", False),
    ("py3-none-any", "cp311", True),
])
def test_interpreter_fits(tags: str, python: str, fits: bool) -> None:
    assert interpreter_fits(f"x-1.0-{tags}.whl", python) is fits
