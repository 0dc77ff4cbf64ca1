"""`wheelforge test --stack` without a GPU: the GPU probe is faked (unit level; the real run
is scripts/stack-on-gpu.sh on the GPU machine), everything else is real: the venv layered
on an interpreter, pip installing the channel through the index with dependencies from a
directory of wheels, pip check, the imports in one interpreter, each recipe's test files run
by pytest in that venv, and the hybrid check's and the attention check's reports read back
(the model programs are stand-ins writing the JSON the real ones write on the GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import make_wheel, write_recipe
from wheelforge import index
from wheelforge.consume import gpustack, gputest
from wheelforge.errors import GpuTestError
from wheelforge.recipe.format import RecipeBook

NO_TARGET: dict[str, Any] = {"channel": None, "cuda": None, "torch": None, "archs": [],
                             "build_key": None}
RECIPE = """format: 1
name: {name}
version: "1.0"
sources:
  - sdist: {{filename: {name}-1.0.tar.gz, sha256: "{sha}"}}
build:
  kind: pure
test:
  files: [test_{name}.py]
  requires: [pytest]
"""
HYBRIDS = """import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / "hybrids.json").write_text(json.dumps({"mamba2": {
    "model": "NemotronHForCausalLM", "kernels": ["causal_conv1d_fwd_kernel", "_chunk_scan_fwd"],
    "fast_path_taken": True, "max_abs_delta_logits_fp32": 1e-6, "max_abs_logits_fp32": 1.5,
    "speedup": 3.0}}))
"""

#: gputests/flash-attn/attention_model.py's JSON, as measured on the H100 (docs/flash-attn.md)
ATTENTION = """import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
result = {"model": "LlamaForCausalLM, 2 layers, head dim 128, bf16", "backward": True,
    "flash_kernels": ["void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128> >(x)",
                      "void flash::flash_bwd_dot_do_o_kernel<true, T>(flash::Flash_bwd_params)"],
    "max_abs_delta_logits": 0.015625, "max_abs_logit": 2.140625,
    "relative_delta_logits": 0.0073, "relative_delta_grads": 0.0027730909,
    "fwd_bwd_ms": {"flash_attention_2": 18.6155, "sdpa": 15.5149}, "passed": PASSED}
(out / "attention_model.json").write_text(json.dumps(result))
sys.exit(0 if result["passed"] else 1)
"""


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, RecipeBook]:
    monkeypatch.setattr(gpustack, "probe_gpu",
                        lambda python: gputest.Gpu("Fake H200", "9.0", "580"))
    dist, deps, root = tmp_path / "dist", tmp_path / "deps", tmp_path / "index"
    alpha = make_wheel(dist, {"alpha/__init__.py": "import helper\nVALUE = helper.X\n"},
                       name="alpha", version="1.0+wf", metadata_extra="Requires-Dist: helper")
    beta = make_wheel(dist, {"beta/__init__.py": "import alpha\n"}, name="beta",
                      version="1.0+wf", metadata_extra="Requires-Dist: alpha==1.0")
    make_wheel(deps, {"helper/__init__.py": "X = 7\n"}, name="helper", version="2.0")
    for w in (alpha, beta):
        index.publish(root, w, **NO_TARGET)
    tests = {"alpha": "import alpha\n\ndef test_value():\n    assert alpha.VALUE == 7\n",
             "beta": "import beta\n\ndef test_imports():\n    assert beta\n"}
    for name, body in tests.items():
        write_recipe(tmp_path, name, RECIPE.format(name=name, sha="0" * 64))
        (tmp_path / "gputests" / name).mkdir(parents=True)
        (tmp_path / "gputests" / name / f"test_{name}.py").write_text(body)
    book = RecipeBook(tmp_path / "recipes", tmp_path / "patches")
    return root, deps, book


def test_the_channel_is_installed_together_and_every_test_runs_in_one_venv(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path) -> None:
    root, deps, book = channel
    hybrids = tmp_path / "hybrids.py"
    hybrids.write_text(HYBRIDS)
    report = gpustack.run_stack_test(
        root, None, book, python=Path(sys.executable), cache_dir=tmp_path / "cache",
        deps_dir=deps, hybrids=hybrids, log=tmp_path / "log")
    assert report.passed, report.lines()
    assert report.pins == ("alpha==1.0+wf", "beta==1.0+wf")
    assert any(i.startswith("helper") for i in report.installed)
    assert report.imports == {"alpha": "ok", "beta": "ok"}
    assert [(t.recipe, t.passed, t.failed) for t in report.tests] == [("alpha", 1, 0),
                                                                      ("beta", 1, 0)]
    lines = report.lines()
    assert lines[0] == "stack on Fake H200 (sm 9.0): alpha==1.0+wf, beta==1.0+wf"
    assert ("hybrid mamba2: NemotronHForCausalLM: fast path taken; kernels "
            "causal_conv1d_fwd_kernel, _chunk_scan_fwd; max |d logits| 1e-06 (max |logits| "
            "1.5); 3.0x the fallback in bf16") in lines
    gpustack.write_report(report, tmp_path / "r.json")
    assert '"passed": true' in (tmp_path / "r.json").read_text()


def test_a_hybrid_without_its_fast_path_fails_the_stack(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path) -> None:
    root, deps, book = channel
    hybrids = tmp_path / "hybrids.py"
    hybrids.write_text(HYBRIDS.replace('"fast_path_taken": True', '"fast_path_taken": False'))
    report = gpustack.run_stack_test(
        root, None, book, python=Path(sys.executable), cache_dir=tmp_path / "cache",
        deps_dir=deps, hybrids=hybrids, log=tmp_path / "log")
    assert not report.passed
    assert any("fast path NOT taken" in ln for ln in report.lines())


def test_a_dependency_the_machine_lacks_is_named(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path) -> None:
    root, _deps, book = channel
    with pytest.raises(GpuTestError) as exc:
        gpustack.run_stack_test(root, None, book, python=Path(sys.executable),
                                cache_dir=tmp_path / "cache", deps_dir=tmp_path / "empty",
                                log=tmp_path / "log")
    assert "missing: helper" in exc.value.why
    assert "--deps-dir" in exc.value.fix


def test_test_takes_a_name_or_stack() -> None:
    res = subprocess.run([sys.executable, "-m", "wheelforge", "test"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert res.returncode == 2
    assert "wheelforge test takes a recipe NAME, or --stack without one" in res.stdout


def _with_flash_attn(root: Path, tmp_path: Path) -> None:
    """A stand-in flash-attn wheel in the channel (the real one needs a GPU to prove)."""
    wheel = make_wheel(tmp_path / "dist", {"flash_attn/__init__.py": ""}, name="flash-attn",
                       version="2.8.3.post2+wf")
    index.publish(root, wheel, **NO_TARGET)


@pytest.mark.parametrize("passed", [True, False])
def test_the_attention_family_runs_when_the_channel_holds_flash_attn(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path, passed: bool) -> None:
    root, deps, book = channel
    _with_flash_attn(root, tmp_path)
    attention = tmp_path / "attention_model.py"
    attention.write_text(ATTENTION.replace("PASSED", str(passed)))
    report = gpustack.run_stack_test(
        root, None, book, python=Path(sys.executable), cache_dir=tmp_path / "cache",
        deps_dir=deps, attention=attention, log=tmp_path / "log")
    assert "flash-attn==2.8.3.post2+wf" in report.pins
    assert report.attention["max_abs_delta_logits"] == 0.015625
    assert report.passed is passed
    assert (f"attention flash-attn: LlamaForCausalLM, 2 layers, head dim 128, bf16: "
            f"{'passed' if passed else 'FAILED'}; kernels flash::flash_bwd_dot_do_o_kernel, "
            "flash::flash_fwd_kernel; max |d logits| 0.0156 (max |logits| 2.14) against sdpa; "
            "gradients 0.28% relative; fwd+bwd 18.6 ms (sdpa 15.5 ms)") in report.lines()


def test_the_attention_family_is_not_run_without_flash_attn(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path) -> None:
    root, deps, book = channel
    attention = tmp_path / "attention_model.py"
    attention.write_text(ATTENTION.replace("PASSED", "False"))
    report = gpustack.run_stack_test(
        root, None, book, python=Path(sys.executable), cache_dir=tmp_path / "cache",
        deps_dir=deps, attention=attention, log=tmp_path / "log")
    assert report.passed and report.attention == {}
    assert not any(ln.startswith("attention") for ln in report.lines())


@pytest.mark.parametrize("body, line, passed", [
    ("raise SystemExit('CUDA error: no kernel image')",
     "attention flash-attn: attention_model.py exited 1 without a result: ", False),
    ("import json, sys, pathlib\nout = pathlib.Path(sys.argv[1]); out.mkdir(parents=True)\n"
     "(out / 'attention_model.json').write_text(json.dumps({'unavailable': 'transformers: "
     "FlashAttention2 cannot be used'}))\nsys.exit(3)",
     "attention flash-attn: transformers: FlashAttention2 cannot be used", True),
])
def test_an_attention_check_without_figures_says_why(
        channel: tuple[Path, Path, RecipeBook], tmp_path: Path, body: str, line: str,
        passed: bool) -> None:
    root, deps, book = channel
    _with_flash_attn(root, tmp_path)
    attention = tmp_path / "attention_model.py"
    attention.write_text(body + "\n")
    report = gpustack.run_stack_test(
        root, None, book, python=Path(sys.executable), cache_dir=tmp_path / "cache",
        deps_dir=deps, attention=attention, log=tmp_path / "log")
    assert report.passed is passed
    assert any(ln.startswith(line) for ln in report.lines()), report.lines()


@pytest.mark.parametrize("subset, chosen", [
    ("head dims 32,64,96,128,192,256; dtypes fp16,bf16; forward and backward; split-kv",
     (128, "bf16", True)),
    ("head dims 64,256; dtypes fp16; forward only; no split-kv", (256, "fp16", False)),
    (None, (128, "bf16", True)),  # upstream's build says nothing: it holds everything
])
def test_the_model_check_runs_what_the_kernel_subset_holds(
        monkeypatch: pytest.MonkeyPatch, subset: str | None,
        chosen: tuple[int, str, bool]) -> None:
    """attention_model.py reads flash_attn_2_cuda.kernel_subset (stand-ins for torch and
    the extension: the real ones need a GPU)."""
    import importlib.util
    import types

    torch = types.SimpleNamespace(bfloat16="bf16", float16="fp16", dtype=str)
    ext = types.SimpleNamespace(**({"kernel_subset": subset} if subset else {}))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "flash_attn_2_cuda", ext)
    path = Path(__file__).parents[1] / "gputests" / "flash-attn" / "attention_model.py"
    spec = importlib.util.spec_from_file_location("wf_attention_model", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.choose(128) == chosen


FAKE_TORCH = """import importlib.util
# run by its file path, the probe has the working directory first on sys.path (as python -c
# has it), never its own directory: gputest.py beside it is not importable
assert importlib.util.find_spec("gputest") is None, "the probe's directory is on sys.path"
__version__ = "9.9.0"
class _Props:
    name, major, minor = "Fake GPU", 9, 0
class cuda:
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 2)
    get_device_properties = staticmethod(lambda index: _Props())
class version:
    cuda = "13.0"
"""


def test_the_gpu_probe_is_a_program_that_asks_the_interpreters_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe (consume/_gpuprobe.py), run by its path from a directory that holds a torch,
    finds that torch (the working directory first, as ``python -c`` had it) and not the
    modules beside the probe; its answer is read into a Gpu."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.chdir(tmp_path)
    gpu = gputest.probe_gpu(Path(sys.executable))
    assert (gpu.name, gpu.capability) == ("Fake GPU", "9.0")
