#!/usr/bin/env python3
"""A no-op nightly over the shipped recipes: every cell already published.

Publishes, for every cell of the matrix in wheelforge.yaml, a stand-in wheel under the
cell's real build key and in the cell's channel (no compile: the wheels are a few bytes,
each holding empty packages of its recipe's verify imports, so the stack check passes),
runs one night untimed (the stack check of each channel runs and records a pass), then
times, side by side in one run:
  A: `wheelforge --version` (interpreter and CLI start-up: the floor)
  B: `wheelforge nightly` over the matrix (every cell skipped; the stack check skipped
     where its channel is unchanged since that pass, issue 53)
and prints both, the ratio B/A, B's margin to the 2 s goal, and how many stack checks B
ran.  Every environment creation or inspection is counted and must be zero; no timing is
asserted.  The stand-ins need no dependencies, so a stack check here is 5-10 s, not the
70 s of the real stack (torch resolved and installed).

    .venv/bin/python bench/nightly_noop.py [--config wheelforge.yaml] [--runs 5]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))

#: the caller's setting: tests/conftest.py turns the stack check off for the tests, and
#: before issue 53 this bench inherited that, so it never timed the check it claimed to
CALLER_STACK_CHECK = os.environ.get("WHEELFORGE_STACK_CHECK")
from conftest import make_wheel  # noqa: E402
from wheelforge import index, nightly  # noqa: E402
from wheelforge._log import Reporter  # noqa: E402
from wheelforge.builder import pipeline  # noqa: E402
from wheelforge.builder.env import buildenv  # noqa: E402
from wheelforge.recipe.format import RecipeBook  # noqa: E402
from wheelforge.recipe.matrix import cells as matrix_cells  # noqa: E402
from wheelforge.recipe.matrix import load_matrix  # noqa: E402


def seed(index_dir: Path, config: Path, book: RecipeBook) -> int:
    """Publish a stand-in wheel under every cell's build key; return the cell count."""
    matrix = load_matrix(config, book.names())
    settings = nightly.Settings(index_dir=index_dir, cache_dir=index_dir.parent / "cache",
                                project_file=config)
    state = nightly.CellRunner(matrix, book, settings, Reporter(io.StringIO()), pipeline.build_one)
    todo = matrix_cells(matrix, state.kinds())
    for n, cell in enumerate(todo):
        plan = state.plan(cell)
        if plan.error is not None:
            raise SystemExit(f"cannot plan {cell.label}: {plan.error.render()}")
        assert plan.recipe is not None and plan.key is not None
        name = str(plan.recipe.name)
        files = {f"{name.replace('-', '_')}_bench/__init__.py": str(n)}
        for module in (*plan.recipe.verify.imports, *plan.recipe.verify.stack_imports):
            parts = module.split(".")
            for i in range(1, len(parts) + 1):
                files["/".join(parts[:i]) + "/__init__.py"] = ""
        wheel = make_wheel(index_dir.parent / "wheels" / str(n), files,
                           name=name, version=f"{plan.recipe.version}+bench{n}")
        if cell.archs is None:  # a pure recipe: the top-level pages, as the nightly
            where: dict[str, object] = {"channel": None, "cuda": None, "torch": None,
                                        "archs": ()}
        else:
            torch = cell.torch.spec.split("==")[-1]
            where = {"channel": index.channel_name(cell.torch.cuda, torch),
                     "cuda": cell.torch.cuda, "torch": torch,
                     "archs": tuple(cell.archs.split(";"))}
        index.publish(index_dir, wheel, build_key=plan.key, **where)  # type: ignore[arg-type]
    return len(todo)


def timed(argv: list[str], runs: int, env: dict[str, str]) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{res.stderr[-2000:]}")
        out = res.stdout + res.stderr
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=REPO / "wheelforge.yaml")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    book = RecipeBook(REPO / "recipes", REPO / "patches")
    created: list[str] = []
    for name in ("managed_env", "inspect_env"):  # count, in the seeding process too
        real = getattr(buildenv, name)

        def spy(*a: object, _real: object = real, _name: str = name, **kw: object) -> object:
            created.append(_name)
            return _real(*a, **kw)  # type: ignore[operator]
        setattr(buildenv, name, spy)
    with tempfile.TemporaryDirectory(prefix="wf-bench-noop-") as tmp:
        idx = Path(tmp) / "index"
        cells = seed(idx, args.config, book)
        env = {k: v for k, v in os.environ.items()
               if k not in ("TORCH_CUDA_ARCH_LIST", "WHEELFORGE_STACK_CHECK")}
        if CALLER_STACK_CHECK is not None:
            env["WHEELFORGE_STACK_CHECK"] = CALLER_STACK_CHECK
        env["PYTHONPATH"] = str(REPO / "src")
        cli = [sys.executable, "-m", "wheelforge"]
        night = [*cli, "nightly", "--config", str(args.config), "--index", str(idx),
                 "--recipes", str(REPO / "recipes"), "--cache-dir", str(Path(tmp) / "cache")]
        first, said = timed(night, 1, env)  # records each channel's passing check
        floor, _ = timed([*cli, "--version"], args.runs, env)
        noop, out = timed(night, args.runs, env)
        envs = out.count("build environment")
        print(f"matrix {args.config}: {cells} cells, all published; median of {args.runs} runs")
        print(f"the first night (untimed in B): {first:7.3f} s, stack checks run: "
              f"{said.count('ok stack check of')}, skipped: {said.count('check skipped')}")
        print(f"B's stack checks run: {out.count('ok stack check of')}, skipped: "
              f"{out.count('check skipped')} (its last run)")
        print(f"A wheelforge --version:   {floor:7.3f} s")
        print(f"B wheelforge nightly:     {noop:7.3f} s   (goal < 2 s: "
              f"{'met' if noop < 2 else 'NOT met'}, margin {2 - noop:+.3f} s)")
        print(f"ratio B/A:                {noop / floor:7.2f}")
        print(f"environments created or opened: {envs + len(created)} "
              f"(nightly output mentions 'build environment' {envs} times; "
              f"seeding asked {len(created)} times)")
        if envs or created:
            raise SystemExit("a no-op nightly touched a build environment")


if __name__ == "__main__":
    main()
