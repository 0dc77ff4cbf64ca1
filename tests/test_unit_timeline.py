"""scripts/unit-timeline.py: a build's units placed on ninja's clock from what
`bench/build_speed.py --keep DIR --phases` keeps (the ninja log, nvcc --time's rows, the
pool's free slots), on a small kept build written here in those files' formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "unit-timeline.py"

HEADER = ("source file name , phase name , phase input files , phase output file , arch , "
          "tool, metric , unit\n")


def phase_rows(source: str, phases: dict[str, float]) -> str:
    """nvcc --time's rows for one unit (milliseconds, as nvcc writes them)."""
    return "".join(f"{source} , {name} , {source}  , x.o , compute_90 , nvcc , "
                   f"{seconds * 1000:.4f} , ms\n" for name, seconds in phases.items())


def kept_build(tmp_path: Path) -> Path:
    kept = tmp_path / "D"
    kept.mkdir()
    # ninja's log: start and end in ms after ninja's start; a host unit and two CUDA units
    (kept / "ninja_log-0D.txt").write_text(
        "# ninja log v6\n"
        "0\t5000\t0\tbuild/temp/csrc/binding.o\tabc\n"
        "0\t10000\t0\tbuild/temp/csrc/units/unit_01_of_02.o\tdef\n"
        "0\t8000\t0\tbuild/temp/csrc/units/unit_02_of_02.o\tghi\n")
    (kept / "phases-0D.csv").write_text(
        HEADER
        + phase_rows("/t/csrc/units/unit_01_of_02.cu",
                     {"gcc (preprocessing 4)": 0.5, "cudafe++": 1.0,
                      "gcc (preprocessing 1)": 0.5, "cicc": 4.0, "ptxas": 2.0,
                      "fatbinary": 0.1, "gcc (compiling)": 1.8})
        + phase_rows("/t/csrc/units/unit_02_of_02.cu",
                     {"gcc (preprocessing 4)": 0.5, "cudafe++": 1.0,
                      "gcc (preprocessing 1)": 0.5, "cicc": 3.0, "ptxas": 1.0,
                      "fatbinary": 0.1, "gcc (compiling)": 1.8}))
    zero = 1_000_000.0
    # one slot free while the host unit runs, two after the second unit ends
    samples = [(zero + t / 10, 1 if t < 50 else 0 if t < 80 else 2) for t in range(100)]
    (kept / "free-0D.json").write_text(json.dumps({"ninja_start": zero, "samples": samples}))
    return kept


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, check=False)


def test_each_unit_is_placed_from_its_start_and_the_idle_slots_counted_by_stretch(
        tmp_path: Path) -> None:
    kept = kept_build(tmp_path)
    done = run(str(kept), "0D")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("ninja: 10.0 s, 2 CUDA units, host units: binding.o 0.0-5.0 s")
    unit_02 = next(line for line in lines if line.startswith("unit_02_of_02.o")).split()
    # start, front (0.5 + 1.0 + 0.5 + 3.0), ptxas, tail (0.1 + 1.8), other (ninja's
    # 8.0 s less the phases), ptxas at (end - tail - ptxas), end
    assert unit_02[1:] == ["0.0", "5.0", "1.0", "1.9", "0.1", "5.1", "8.0"]
    assert "units end 8.0-10.0 s (2.0 s apart); front ends 5.0-6.0 s" in done.stdout
    # the host unit's slot is free while it runs; nothing is free until the first unit
    # ends; then two slots for 2 s
    assert "from ninja's start; a host unit holds no slot, its core is busy):    5.0" \
        in done.stdout
    assert "from the first unit's end):    4.0" in done.stdout
    assert "in all: 9.0" in done.stdout


def test_a_build_not_kept_with_phases_is_a_clear_error(tmp_path: Path) -> None:
    kept = kept_build(tmp_path)
    (kept / "phases-0D.csv").unlink()
    done = run(str(kept), "0D")
    assert done.returncode == 2
    assert "unit-timeline: cannot read the build's files" in done.stderr
    assert "Traceback" not in done.stderr
