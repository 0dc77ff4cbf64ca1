"""Failure diagnosis: every recorded log yields its signature; unknown ones their first error."""

from __future__ import annotations

from pathlib import Path

import pytest

from wheelforge.builder.compiling.diagnose import (
    Diagnosis,
    diagnose,
    first_error_line,
    load_signatures,
    parse_signatures,
)
from wheelforge.errors import WheelforgeError

LOGS = Path(__file__).parent / "logs"

# log file, the diagnoses in table order, the first one's line number and a part of its line
RECORDED = [
    ("causal_conv1d_nameerror", ["WF-D001"], 35, "NameError: name 'bare_metal_version'"),
    ("cuda_home_not_set", ["WF-D002"], 31, "OSError: CUDA_HOME environment variable is not set"),
    ("patched_no_nvcc", ["WF-D002"], 20, "needs nvcc, the CUDA compiler, and none was found"),
    ("nvcc_unsupported_compute_120", ["WF-D003"], 27,
     "nvcc fatal   : Unsupported gpu architecture 'compute_120'"),
    ("ninja_fallback_old_nvcc", ["WF-D003", "WF-D014"], 26, "Unsupported gpu architecture"),
    ("torch_cuda_mismatch", ["WF-D004"], 39, "The detected CUDA version (12.4) mismatches"),
    ("gcc_unsupported", ["WF-D005"], 29, "gcc versions later than 15 are not supported"),
    ("cuda_runtime_h_missing", ["WF-D006"], 27, "fatal error: cuda_runtime.h: No such file"),
    ("python_h_missing", ["WF-D007"], 35, "fatal error: Python.h: No such file or directory"),
    ("no_space_left", ["WF-D008"], 31, "No space left on device"),
    ("oom_cicc_signal9", ["WF-D009"], 36, "'cicc' died due to signal 9 (Kill signal)"),
    ("oom_cc1plus_killed", ["WF-D009"], 31, "Killed signal terminated program cc1plus"),
    ("oom_killed_137", ["WF-D009"], 11, "Killed"),
    ("torch_missing_isolation", ["WF-D010"], 30, "No module named 'torch'"),
    ("undefined_symbol_import", ["WF-D011"], 10, "undefined symbol: _ZN3c106detail"),
    ("glibcxx_not_found", ["WF-D012"], 15, "version `GLIBCXX_3.4.32' not found"),
    ("no_kernel_image", ["WF-D013"], 16, "no kernel image is available"),
    ("ninja_missing_jit", ["WF-D014"], 13, "No such file or directory: 'ninja'"),
]
UNKNOWN = [
    ("unknown_template_error", 38, "causal_conv1d_fwd.cu(241): error: no instance of overloaded"),
]


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text(encoding="utf-8")


@pytest.mark.parametrize(("name", "ids", "line_no", "part"), RECORDED,
                         ids=[case[0] for case in RECORDED])
def test_recorded_log_is_diagnosed(name: str, ids: list[str], line_no: int, part: str) -> None:
    text = log(name)
    found = diagnose(text)
    assert [d.id for d in found] == ids
    first = found[0]
    assert (first.line_no, part in first.line) == (line_no, True)
    assert first.line == text.splitlines()[line_no - 1].strip()
    assert first.title and first.cause and first.fix
    assert "{" not in first.cause + first.fix  # every placeholder filled


@pytest.mark.parametrize(("name", "line_no", "part"), UNKNOWN, ids=[c[0] for c in UNKNOWN])
def test_unknown_failure_points_at_the_first_error(name: str, line_no: int, part: str) -> None:
    text = log(name)
    assert diagnose(text) == []
    found = first_error_line(text)
    assert found is not None
    assert found[0] == line_no and part in found[1]


def test_every_signature_has_a_recorded_log() -> None:
    table = {s.id for s in load_signatures()}
    covered = {i for _, ids, _, _ in RECORDED for i in ids}
    assert covered == table


def test_every_recorded_log_is_tested() -> None:
    on_disk = {p.stem for p in LOGS.glob("*.log")}
    assert on_disk == {c[0] for c in RECORDED} | {c[0] for c in UNKNOWN}


def test_ids_are_unique_and_stable() -> None:
    ids = [s.id for s in load_signatures()]
    assert len(ids) == len(set(ids))
    assert ids == sorted(ids)
    assert all(i.startswith("WF-D") and len(i) == 7 for i in ids)
    assert load_signatures() is load_signatures()  # parsed and validated once


# -- values taken from the log ----------------------------------------------------------------

def only(text: str, jobs: int | None = None) -> Diagnosis:
    found = diagnose(text, jobs=jobs)
    assert len(found) == 1, found
    return found[0]


def test_out_of_memory_suggests_half_the_jobs_from_the_log() -> None:
    assert "--jobs 8 " in only(log("oom_cicc_signal9")).fix  # MAX_JOBS (16)
    assert "--jobs 16 " in only(log("oom_killed_137")).fix  # MAX_JOBS=32 in the docker step
    assert "16 compile jobs ran at once" in only(log("oom_cicc_signal9")).cause


def test_out_of_memory_jobs_from_the_caller_win() -> None:
    assert "--jobs 3 " in only(log("oom_cicc_signal9"), jobs=6).fix


@pytest.mark.parametrize("jobs", [None, 1])
def test_out_of_memory_without_a_number(jobs: int | None) -> None:
    d = only(log("oom_cc1plus_killed"), jobs)
    assert "rerun with a lower --jobs" in d.fix and "4 GiB" in d.fix


@pytest.mark.parametrize(("gpu", "needs"), [
    ("compute_120", "architecture 12.0 needs CUDA 12.8"),
    ("compute_110", "architecture 11.0 needs CUDA 13.0"),
    ("compute_103a", "architecture 10.3a needs CUDA 12.9"),
    ("compute_99", "the toolkit predates that architecture"),
])
def test_unsupported_arch_names_the_cuda_it_needs(gpu: str, needs: str) -> None:
    d = only(f"nvcc fatal   : Unsupported gpu architecture '{gpu}'\n")
    assert d.id == "WF-D003" and needs in d.cause and "{" not in d.fix


def test_sm_value_not_defined_is_the_same_diagnosis() -> None:
    d = only("nvcc fatal   : Value 'sm_120' is not defined for option 'gpu-name'\n")
    assert d.id == "WF-D003" and "drop 12.0 from --arch" in d.fix


def test_cuda_mismatch_names_both_versions() -> None:
    d = only(log("torch_cuda_mismatch"))
    assert "nvcc is CUDA 12.4" in d.cause and "built with CUDA 13.0" in d.cause


def test_clang_too_new_uses_the_generic_cause() -> None:
    d = only("host_config.h:151:2: error: #error -- unsupported clang version! clang version "
             "must be less than 21 and greater than 3.2 .\n")
    assert d.id == "WF-D005" and "gcc" not in d.cause


# -- matching rules ---------------------------------------------------------------------------

def test_colour_codes_and_carriage_returns_are_ignored() -> None:
    text = ("[1/2] c++ ...\r\n\x1b[01m\x1b[Kfoo.cpp:3:10:\x1b[m\x1b[K \x1b[01;31m\x1b[Kfatal "
            "error: \x1b[m\x1b[KPython.h: No such file or directory\r\n")
    d = only(text)
    assert (d.id, d.line_no, d.line) == (
        "WF-D007", 2, "foo.cpp:3:10: fatal error: Python.h: No such file or directory")


def test_a_signature_is_reported_once_at_its_first_line() -> None:
    text = log("gcc_unsupported")
    assert text.count("gcc versions later than 15") == 4
    assert [d.line_no for d in diagnose(text)] == [29]


def test_table_priority_not_log_position_orders_diagnoses() -> None:
    found = diagnose(log("ninja_fallback_old_nvcc"))
    assert [d.id for d in found] == ["WF-D003", "WF-D014"]
    assert found[0].line_no > found[1].line_no


def test_a_killed_line_needs_to_stand_alone() -> None:
    assert diagnose("the process was Killed by the user in 2024, see notes\n") == []
    assert diagnose("\n\nKilled\n")[0].line_no == 3


# -- first error line -------------------------------------------------------------------------

CHAINED = """\
running build_ext
Traceback (most recent call last):
  File "a.py", line 1, in <module>
    run()
subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "b.py", line 9, in <module>
    raise RuntimeError(message) from e
RuntimeError: Error compiling objects for extension
"""
PIP_ONLY = """\
Building wheels for collected packages: demo
  error: subprocess-exited-with-error
  × Building wheel for demo (pyproject.toml) did not run successfully.
  │ exit code: 1
ERROR: Failed building wheel for demo
"""
FAILED_NO_DIAGNOSTIC = """\
[1/2] nvcc -c a.cu -o a.o
FAILED: a.o
nvcc -c a.cu -o a.o
[2/2] nvcc -c b.cu -o b.o
ninja: build stopped: subcommand failed.
"""
MESSAGE_ON_NEXT_LINE = """\
Traceback (most recent call last):
  File "x.py", line 3, in <module>
RuntimeError:
The detected CUDA version (12.4) mismatches the version that was used to compile
"""
LINKER = """\
g++ -shared a.o -o demo.so -lcudart
/usr/bin/ld: a.o: in function `run':
a.cpp:(.text+0x1c): undefined reference to `cudaLaunchKernel'
collect2: error: ld returned 1 exit status
"""
WARNINGS_ONLY = """\
/x/cpp_extension.py:418: UserWarning: There are no g++ version bounds defined for CUDA 12.2
nvcc warning : The 'compute_75' architecture is deprecated (-Werror=deprecated to fail)
foo.cu(12): warning #177-D: variable "error" was declared but never referenced
"""


@pytest.mark.parametrize(("text", "expected"), [
    (CHAINED, (12, "RuntimeError: Error compiling objects for extension")),
    (PIP_ONLY, (2, "error: subprocess-exited-with-error")),
    (FAILED_NO_DIAGNOSTIC, (2, "FAILED: a.o")),
    (MESSAGE_ON_NEXT_LINE, (3, "RuntimeError: The detected CUDA version (12.4) mismatches the "
                               "version that was used to compile")),
    (LINKER, (3, "a.cpp:(.text+0x1c): undefined reference to `cudaLaunchKernel'")),
    (WARNINGS_ONLY, None),
    ("", None),
], ids=["chained-traceback", "pip-wrapper-only", "ninja-failed-step", "message-next-line",
        "linker", "warnings-only", "empty"])
def test_first_error_line(text: str, expected: tuple[int, str] | None) -> None:
    assert first_error_line(text) == expected


def test_first_error_line_prefers_the_traceback_inside_pip_output() -> None:
    assert first_error_line(log("torch_missing_isolation")) == (
        30, "ModuleNotFoundError: No module named 'torch'")


def test_first_error_line_reads_pytest_errors() -> None:
    found = first_error_line(log("glibcxx_not_found"))
    assert found is not None and found[0] == 15 and "E   ImportError:" in found[1]


# -- the table is validated -------------------------------------------------------------------

GOOD = """\
format: 1
signatures:
  - id: WF-D001
    title: a
    patterns: "x (?P<n>\\\\d+)"
    cause: saw {n}
    fix: do {jobs}
    fix-fallback: do less
"""


def test_a_minimal_table_parses() -> None:
    (sig,) = parse_signatures(GOOD)
    assert sig.id == "WF-D001" and sig.fix_fallback == "do less"
    (d,) = diagnose("x 7\n", signatures=(sig,))
    assert (d.cause, d.fix, d.line, d.line_no) == ("saw 7", "do less", "x 7", 1)
    (d,) = diagnose("x 7\n", signatures=(sig,), jobs=4)
    assert d.fix == "do 4"


@pytest.mark.parametrize(("text", "messages"), [
    ("format: 1\nsignatures: [\n", ["not valid YAML"]),
    ("- a\n", ["top level must be a mapping"]),
    ("format: 2\nsignatures: []\n", ["format must be 1", "non-empty list"]),
    ("""\
format: 1
signatures:
  - id: WF-D001
    title: a
    patterns: "("
    cause: c
    fixx: f
  - id: D2
    title: b
    patterns: ["ok", 3]
    cause: c
    fix: f
  - id: WF-D003
    title: t {n}
    patterns: ["(?P<n>a)", "b"]
    cause: "{n} {nope}"
    fix: "{n}"
    fix-fallback: "{n}"
  - id: WF-D003
    title: dup
    patterns: z
    cause: c
    fix: f
""", ["signatures[0] (WF-D001): unknown key 'fixx' (did you mean fix?)",
      "signatures[0] (WF-D001): fix is missing",
      "signatures[0] (WF-D001): patterns[0] is not a valid regular expression",
      "signatures[1] (D2): id 'D2' must look like WF-D001",
      "signatures[1] (D2): patterns[1] must be a non-empty string",
      "signatures[2] (WF-D003): title must be plain text",
      "signatures[2] (WF-D003): cause uses unknown placeholder(s) {nope}",
      "signatures[2] (WF-D003): cause uses {n}, {nope}, which not every match provides; "
      "add cause-fallback",
      "signatures[2] (WF-D003): fix-fallback may only use placeholders every match provides, "
      "not {n}",
      "signatures[3] (WF-D003): id WF-D003 is already used by signatures[2]"]),
], ids=["not-yaml", "not-a-mapping", "format-and-empty", "every-problem-at-once"])
def test_a_bad_table_is_one_clear_error(text: str, messages: list[str]) -> None:
    with pytest.raises(WheelforgeError) as exc:
        parse_signatures(text, source="bad.yaml")
    assert exc.value.what == "the failure signature table bad.yaml is invalid"
    for message in messages:
        assert message in exc.value.why


def test_undefined_symbol_only_at_import() -> None:
    assert diagnose("ld.lld: error: undefined symbol: cudaLaunchKernel\n") == []
    d = only("OSError: /x/libops.so: undefined symbol: _ZN2at4_ops3add4callEv\n")
    assert d.id == "WF-D011" and "_ZN2at4_ops3add4callEv" in d.cause


@pytest.mark.parametrize("returncode", [-9, 137])
def test_a_build_backend_killed_by_sigkill_is_out_of_memory(tmp_path: Path,
                                                           returncode: int) -> None:
    """The OOM killer may take the build backend's Python (the largest process: it holds
    torch) rather than a compiler; its log then ends with no compiler message at all."""
    from wheelforge._proc import CommandFailed
    from wheelforge.builder.compiling.backend import failure

    log_file = tmp_path / "build.log"
    log_file.write_text("running build_ext\nbuilding 'tinyext_cuda' extension\n")
    err = failure("tinyext-0.1.0", CommandFailed(["python"], returncode, ""), log_file, jobs=4)
    assert "[WF-D009]" in str(err)
    assert "--jobs 2" in err.fix
