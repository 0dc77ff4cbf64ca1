#!/usr/bin/env python3
"""The build backend's interpreter ended with os._exit against its usual teardown.

Side by side in one run, alternating which goes first: a project whose setup.py imports
torch (as every extension's does) built through wheelforge's build step
(backend.build_wheel: pypa/build's build_wheel hook in the build environment's
interpreter), with the hook runner as shipped (A: the interpreter ends with os._exit once
the hook has returned) and with the same runner ending as Python does (B: atexit
handlers, module and object teardown of an interpreter holding torch).  Prints each
build's wall time, the medians, B - A (the seconds a build's critical path saves, on one
core) and the load average.  No timing is asserted.

    .venv/bin/python bench/hook_exit.py [--rounds 4] [--python PATH]

--python builds with that interpreter (it must have torch and setuptools), as `wheelforge
build --python` does; default: the managed build environment (made if missing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.compiling import backend  # noqa: E402
from wheelforge.builder.config import resolve  # noqa: E402
from wheelforge.builder.env import buildenv, bytecode  # noqa: E402

SETUP = """\
import torch.utils.cpp_extension  # what an extension's setup.py imports first
from setuptools import setup

setup(name="torchhook", version="0.1.0", py_modules=["torchhook"])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--python", type=Path, default=None,
                    help="build with this interpreter (torch and setuptools installed)")
    args = ap.parse_args()
    config = resolve(environ=dict(os.environ))
    if args.python:
        env = buildenv.inspect_env(args.python.absolute())
    else:
        env = buildenv.managed_env(config.cache_dir, base_python=config.base_python,
                                   torch_req=config.torch, requirements=("setuptools",))
    environ = bytecode.environ(dict(os.environ, PYTHONUNBUFFERED="1"), python=env.python,
                               managed=env.managed, cache_dir=config.cache_dir)
    shipped = backend.HOOK_RUNNER
    # the same runner without its ending: the interpreter's usual exit
    runners = {"A os._exit": shipped, "B teardown": backend.RUN_HOOK}
    print(f"{env.describe()}; load average before: "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    times: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory(prefix="wf-hook-exit-") as tmp:
        tree = Path(tmp) / "torchhook"
        tree.mkdir()
        (tree / "setup.py").write_text(SETUP)
        (tree / "torchhook.py").write_text("")
        (tree / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools"]\n'
            'build-backend = "setuptools.build_meta"\n')
        # a first build: bytecode written, files in the page cache, for both alike
        backend.build_wheel(tree=tree, env=env, environ=environ, out_dir=Path(tmp) / "warm",
                            log=Path(tmp) / "warm.log")
        for r in range(args.rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            for name in order:
                backend.HOOK_RUNNER = runners[name]
                out = Path(tmp) / f"{r}-{name[0]}"
                t0 = time.monotonic()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    backend.build_wheel(tree=tree, env=env, environ=environ, out_dir=out,
                                        log=out.with_suffix(".log"))
                times[name].append(time.monotonic() - t0)
                print(f"  round {r + 1}, {name}: {times[name][-1]:.2f} s", flush=True)
    backend.HOOK_RUNNER = shipped
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, v in times.items():
        print(f"{name:11} median {med[name]:.2f} s ({', '.join(f'{x:.2f}' for x in v)})")
    print(f"B - A: {med['B teardown'] - med['A os._exit']:.2f} s on one core per build; "
          f"B / A: {med['B teardown'] / med['A os._exit']:.2f}x")
    print("load average after: " + " ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
