"""The stack on a GPU: every wheel of a channel installed together into one venv over the
given interpreter, every recipe's GPU test run in that venv, and tiny hybrid models from
the interpreter's transformers checked for the fast path by the CUDA kernels that ran;
when the channel holds flash-attn, a small Llama with ``flash_attention_2`` against
``sdpa`` (the attention family: gputests/flash-attn/attention_model.py).

The venv is layered on the interpreter (:func:`wheelforge.consume.gputest.overlay_venv`):
its torch, transformers and triton are used, the channel's wheels come from the index, and
pip resolves every other dependency from ``deps_dir`` (a GPU machine without network gets
the missing packages carried as wheels).  Nothing is installed with ``--no-deps``: pip
resolves the whole stack, as for a user; what the interpreter already holds satisfies its
requirements and is named in the output.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from .. import _proc, index
from .._fs import atomic_write
from ..errors import GpuTestError
from ..recipe.format import RecipeBook
from .gputest import collect_tests, overlay_venv, probe_gpu, run_pytest
from .install import plan as install_plan
from .stack import IMPORTER, MARK
from .stackinputs import modules_to_import
from .venv import child_env

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class RecipeRun:
    recipe: str
    passed: int
    failed: int
    skipped: int
    errors: int
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class StackGpuReport:
    channel: str | None
    gpu: str
    capability: str
    date: str
    python: str
    pins: tuple[str, ...]
    from_interpreter: tuple[str, ...]  # requirements the interpreter already satisfied
    installed: tuple[str, ...]  # what pip installed into the venv
    pip_check: str
    imports: Mapping[str, str]  # module -> "ok" or the error
    tests: tuple[RecipeRun, ...] = ()
    hybrids: Mapping[str, Any] = field(default_factory=dict)
    attention: Mapping[str, Any] = field(default_factory=dict)  # attention_model.py's JSON
    passed: bool = False

    def lines(self) -> list[str]:
        out = [f"stack on {self.gpu} (sm {self.capability}): {', '.join(self.pins)}",
               "installed into the venv: " + (", ".join(self.installed) or "nothing"),
               "from the interpreter: " + (", ".join(self.from_interpreter) or "nothing"),
               "pip check: " + (self.pip_check or "no broken requirements"),
               "imports: " + ", ".join(f"{m} {v}" for m, v in self.imports.items())]
        for t in self.tests:
            out.append(f"test {t.recipe}: {t.passed} passed, {t.failed} failed, "
                       f"{t.skipped} skipped, {t.errors} errors in {t.duration_s:.0f}s")
        for family, h in self.hybrids.items():
            if "model" not in h:
                out.append(f"hybrid {family}: {h.get('unavailable') or h.get('error', '?')[:300]}")
                continue
            out.append(
                f"hybrid {family}: {h['model']}: fast path "
                f"{'taken' if h['fast_path_taken'] else 'NOT taken'}; kernels "
                f"{', '.join(k[:60] for k in h['kernels'][:8]) or 'none of the stack'}; "
                f"max |d logits| {h['max_abs_delta_logits_fp32']:.3g} (max |logits| "
                f"{h['max_abs_logits_fp32']:.3g}); {h['speedup']}x the fallback in bf16")
        if self.attention:
            out.append(attention_line(self.attention))
        return out


def attention_line(a: Mapping[str, Any]) -> str:
    """The attention family's model check in one line: flash-attn's kernels by name (the
    function, without its template arguments), Δ logits and gradients against sdpa, times."""
    if "model" not in a:
        return f"attention flash-attn: {a.get('unavailable') or a.get('error', '?')[:300]}"
    names = sorted({k.removeprefix("void ").split("<")[0].split("(")[0]
                    for k in a.get("flash_kernels", [])})
    grads = a.get("relative_delta_grads")
    ms = a.get("fwd_bwd_ms", {})
    return (f"attention flash-attn: {a['model']}: "
            f"{'passed' if a.get('passed') else 'FAILED'}; kernels "
            f"{', '.join(names) or 'none of flash-attn'}; max |d logits| "
            f"{a['max_abs_delta_logits']:.3g} (max |logits| {a['max_abs_logit']:.3g}) against "
            f"sdpa; gradients {'not run (forward only)' if grads is None else f'{grads:.2%}'}"
            f" relative; {'fwd+bwd' if grads is not None else 'fwd'} "
            f"{ms.get('flash_attention_2', 0):.1f} ms (sdpa {ms.get('sdpa', 0):.1f} ms)")


def run_stack_test(index_dir: Path, channel: str | None, book: RecipeBook, *, python: Path,
                   cache_dir: Path, sources_dirs: tuple[Path, ...] = (),
                   git_mirrors: Mapping[str, Path] | None = None, deps_dir: Path | None = None,
                   workers: int = 1, hybrids: Path | None = None,
                   attention: Path | None = None, log: Path,
                   say: Progress = lambda _: None) -> StackGpuReport:
    gpu = probe_gpu(python)
    say(f"GPU: {gpu.name} (compute capability {gpu.capability})")
    records = index.load_records(index_dir)
    p = install_plan(records, index_dir=index_dir, url=None, channel=channel)
    chosen = [r for r in records if f"{r.project}=={r.version}" in p.pins]
    with tempfile.TemporaryDirectory(prefix="wf-stack-gpu-") as tmp:
        work = Path(tmp)
        vpy = overlay_venv(python, work / "venv", log)
        env = {**{k: v for k, v in child_env().items() if not k.startswith("PIP_")},
               "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}
        source = ["--find-links", str(deps_dir)] if deps_dir else []
        say(f"installing {', '.join(p.pins)} from {p.index_url}"
            + (f" (dependencies from {deps_dir})" if deps_dir else ""))
        res = _proc.run([str(vpy), "-m", "pip", "install", "--disable-pip-version-check",
                         "--no-cache-dir", "--index-url", p.index_url, *source, *p.pins],
                        env=env, log=log, check=False)
        if res.returncode != 0:
            missing = [ln.split("for ", 1)[-1] for ln in res.output.splitlines()
                       if "No matching distribution found for" in ln]
            raise GpuTestError(
                f"pip could not install the stack of {channel or 'simple/'} over {python}",
                why=(f"missing: {', '.join(missing)}" if missing else
                     res.output.strip()[-800:]),
                fix="carry the missing packages as wheels and pass their directory with "
                    "--deps-dir", log=str(log))
        satisfied = sorted({ln.split("Requirement already satisfied: ", 1)[1].split(" in ")[0]
                            for ln in res.output.splitlines()
                            if ln.startswith("Requirement already satisfied: ")})
        installed = next((ln.split("Successfully installed ", 1)[1].split()
                          for ln in res.output.splitlines()
                          if ln.startswith("Successfully installed ")), [])
        check = _proc.run([str(vpy), "-m", "pip", "check", "--disable-pip-version-check"],
                          env=env, log=log, check=False)
        wheels = [index_dir / index.FILES_DIR / r.filename for r in chosen]
        modules = modules_to_import(book, wheels)
        say(f"importing {', '.join(modules)} in one interpreter")
        imp = _proc.run([str(vpy), IMPORTER, json.dumps(modules)], env=env, log=log,
                        check=False, cwd=work)
        answer = _proc.marked(imp.output, MARK)
        outcomes = answer.get("imports", []) if isinstance(answer, dict) else []
        imports = {o["module"]: "ok" if o["ok"] else o["error"] for o in outcomes}
        runs = []
        names = {canonicalize_name(r.project) for r in chosen}
        for name in sorted(n for n in names if n in book.names()):
            recipe = book.load(name)
            if recipe.test.empty:
                continue
            tests = collect_tests(recipe, work / "tests" / name, work / "src" / name,
                                  cache_dir=cache_dir, sources_dirs=sources_dirs,
                                  git_mirrors=git_mirrors, say=say)
            say(f"test {name}: {', '.join(sorted(f.name for f in tests.iterdir()))}")
            start = time.monotonic()
            _res, (passed, failed, skipped, errors) = run_pytest(
                vpy, tests, work / f"junit-{name}.xml", workers=workers, log=log, say=say,
                what=name)
            runs.append(RecipeRun(recipe=name, passed=passed, failed=failed, skipped=skipped,
                                  errors=errors, duration_s=round(time.monotonic() - start, 1)))
        hybrid_report: dict[str, Any] = {}
        if hybrids is not None and hybrids.is_file():
            say("hybrid models: fast run (profiled) and fallback run of each family")
            out = work / "hybrids"
            _proc.run([str(vpy), str(hybrids), str(out)], env=env, log=log, check=False,
                      cwd=work, timeout=3600)
            if (out / "hybrids.json").is_file():
                hybrid_report = json.loads((out / "hybrids.json").read_text())
        attention_report: dict[str, Any] = {}
        if attention is not None and attention.is_file() and "flash-attn" in names:
            attention_report = _attention_check(vpy, attention, work, env, log, say)
    ok = (check.returncode == 0 and bool(imports) and all(v == "ok" for v in imports.values())
          and all(r.failed == r.errors == 0 and r.passed > 0 for r in runs)
          and all(h.get("fast_path_taken", True) and "error" not in h
                  for h in hybrid_report.values())
          and (not attention_report or "unavailable" in attention_report
               or attention_report.get("passed") is True))
    return StackGpuReport(
        channel=channel, gpu=gpu.name, capability=gpu.capability,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        python=str(python), pins=p.pins, from_interpreter=tuple(satisfied),
        installed=tuple(installed),
        pip_check="" if check.returncode == 0 else check.output.strip()[-1500:],
        imports=imports, tests=tuple(runs), hybrids=hybrid_report,
        attention=attention_report, passed=ok)


def _attention_check(vpy: Path, script: Path, work: Path, env: Mapping[str, str], log: Path,
                     say: Progress) -> dict[str, Any]:
    """The attention family: flash-attn's model check (its own program, run in the venv),
    its JSON read back; an error with the output's tail when it wrote none."""
    say("attention model: a small Llama, flash_attention_2 against sdpa, forward and backward")
    out = work / "attention"
    res = _proc.run([str(vpy), str(script), str(out)], env=env, log=log, check=False,
                    cwd=work, timeout=1800)
    answer = out / "attention_model.json"
    if not answer.is_file():
        return {"error": f"{script.name} exited {res.returncode} without a result: "
                         + res.output.strip()[-1500:]}
    report: dict[str, Any] = json.loads(answer.read_text())
    if res.returncode not in (0, 1, 3):
        report["passed"] = False
        report.setdefault("error", f"{script.name} exited {res.returncode}")
    return report


def write_report(report: StackGpuReport, path: Path) -> None:
    atomic_write(path, json.dumps(asdict(report), indent=1) + "\n")
