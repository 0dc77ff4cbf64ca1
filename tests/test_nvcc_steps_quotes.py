"""builder/compiling/nvccsteps.py and a path with a quote (issue 52): nvcc's dry run
leaves its ``rm`` step's path unquoted, so a unit or object named ``k'q`` gave a
traceback when the steps were read (shlex: no closing quotation).  Such a unit now runs
nvcc as given, which compiles it."""

from __future__ import annotations

from pathlib import Path

import pytest

import test_nvcc_steps
from test_nvcc_steps import UNIT, compile_args, run_steps
from wheelforge.builder.compiling import nvccsteps

fifo = test_nvcc_steps.fifo  # the fixture: a jobserver's named pipe

USUAL = ["gcc -E -x c++ -D__CUDACC__ k.cu -o k.cpp4.ii",
         "cudafe++ --gen_c_file_name k.cudafe1.cpp k.cpp4.ii",
         "gcc -D__CUDA_ARCH__=1200 -E -x c++ k.cu -o k.cpp1.ii",
         '"$CICC_PATH/cicc" k.cpp1.ii -o k.ptx', "ptxas -arch=sm_120 k.ptx -o k.cubin",
         'fatbinary --create="k.fatbin" --embedded-fatbin="k.fatbin.c"',
         "gcc -c -x c++ k.cudafe1.cpp -o k.o", "rm k.fatbin"]


def test_a_step_shlex_cannot_read_leaves_the_plan_unusable() -> None:
    steps = [s.replace("k.", "k'q.") for s in USUAL]
    steps = [s if s.startswith("rm ") else s.replace("k'q.", "\"k'q.") for s in steps]
    plan = nvccsteps.Plan("".join(f"#$ {s}\n" for s in steps))  # no exception
    assert not plan.usable()
    assert nvccsteps.Plan("#$ X='unclosed\n").assigns == {}


@pytest.mark.parametrize("name", ["k'q", 'k"q', "k q", "k\\q", "k$q"])
def test_a_path_the_dry_run_may_leave_unquoted_runs_nvcc_as_given(name: str) -> None:
    args = ["-c", f"{name}.cu", "-o", f"{name}.o"]
    assert nvccsteps.unquotable(args)
    assert not nvccsteps.unquotable(["-c", "k.cu", "-o", "out/k.o", "-MD", "-MF", "k.o.d",
                                     '-DPYBIND11_COMPILER_TYPE="_gcc"'])


@pytest.mark.nvcc
def test_a_unit_named_with_a_quote_compiles(tmp_path: Path, nvcc: str,
                                            fifo: tuple[Path, int]) -> None:
    path, _ = fifo
    src = tmp_path / "k'q.cu"
    src.write_text(UNIT)
    out = tmp_path / "out" / "k'q.o"
    out.parent.mkdir()
    done = run_steps(compile_args(nvcc, src, out), tmp_path,
                     f" -j2 --jobserver-auth=fifo:{path}", tmp_path / "report.txt")
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert out.is_file()
    assert (tmp_path / "report.txt").read_text().split()[0] == "plain"
