#!/usr/bin/env python3
"""Prove that two builds of one CUDA extension differ in nothing but how they were built.

    scripts/compare-wheels.py A.whl B.whl

For every extension module (.so) present in both wheels, compares:

- the exported symbols (`nm -D --defined-only`, demangled names and kinds);
- the CUDA architectures embedded (SASS and PTX, read by wheelforge.builder.artifact.fatbin);
- the code of every kernel: `cuobjdump -sass` of each module, one listing per
  kernel (function name -> instructions), compared kernel by kernel.

Prints what it compared and every difference; exits 0 when identical, 1 when not.
Needs `nm` (binutils) and `cuobjdump` (CUDA toolkit: $CUOBJDUMP, on PATH or in
$CUDA_HOME/bin; a toolkit without it can use the copy Triton ships, e.g.
CUOBJDUMP=.../site-packages/triton/backends/nvidia/bin/cuobjdump).
Used to show that patch 0005 of causal-conv1d and patch 0008 of mamba-ssm (the splits
into several translation units) change the build and nothing else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from wheelforge.builder.artifact.fatbin import cuda_archs_of_file, format_archs  # noqa: E402

FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)


def tool(name: str) -> str:
    found = os.environ.get(name.upper()) or shutil.which(name)
    if not found and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / name
        found = str(candidate) if candidate.exists() else None
    if not found and Path(f"/usr/local/cuda/bin/{name}").exists():
        found = f"/usr/local/cuda/bin/{name}"
    if not found:
        sys.exit(f"compare-wheels: {name} not found (put it on PATH or set CUDA_HOME)")
    return found


def exported(so: Path) -> set[str]:
    out = subprocess.run([tool("nm"), "-D", "--defined-only", "-C", str(so)], check=True,
                         capture_output=True, text=True).stdout
    # "<address> <kind> <name>": the address differs between any two links
    return {line.split(" ", 1)[1] for line in out.splitlines() if " " in line}


def kernels(so: Path) -> dict[str, str]:
    out = subprocess.run([tool("cuobjdump"), "-sass", str(so)], check=True,
                         capture_output=True, text=True).stdout
    parts = FUNCTION.split(out)
    listing: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        # keep the instructions (offset, instruction, encoding), whitespace collapsed:
        # cuobjdump pads each listing to its widest instruction; drop the headers
        code = [" ".join(ln.split()) for ln in body.splitlines()
                if ln.strip().startswith("/*")]
        listing[name] = "\n".join(code)
    return listing


def modules(wheel: Path, dest: Path) -> dict[str, Path]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".so")]
        for n in names:
            zf.extract(n, dest)
    return {Path(n).name: dest / n for n in names}


def compare(a: Path, b: Path) -> list[str]:
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        mods_a = modules(a, Path(tmp) / "a")
        mods_b = modules(b, Path(tmp) / "b")
        if set(mods_a) != set(mods_b):
            problems.append(f"extension modules differ: {sorted(mods_a)} vs {sorted(mods_b)}")
        for name in sorted(set(mods_a) & set(mods_b)):
            so_a, so_b = mods_a[name], mods_b[name]
            sym_a, sym_b = exported(so_a), exported(so_b)
            print(f"{name}: exported symbols {len(sym_a)} vs {len(sym_b)}, "
                  f"{len(sym_a & sym_b)} in both")
            for label, only in (("A", sym_a - sym_b), ("B", sym_b - sym_a)):
                weak = [x for x in only if x.startswith("W ")]
                if weak:
                    # out-of-line copies of inline/template code: there or not as the
                    # host compiler's inliner decides, which depends on the whole unit
                    print(f"{name}: {len(weak)} weak function symbol(s) only in {label} "
                          f"(inline/template code the other build inlined)")
                for x in sorted(only)[:20]:
                    problems.append(f"{name}: only in {label}: {x}")
            arch_a, arch_b = cuda_archs_of_file(so_a), cuda_archs_of_file(so_b)
            print(f"{name}: CUDA code {format_archs(arch_a)} vs {format_archs(arch_b)}")
            if arch_a != arch_b:
                problems.append(f"{name}: architectures differ")
            if arch_a.empty:
                continue
            k_a, k_b = kernels(so_a), kernels(so_b)
            same = [k for k in k_a.keys() & k_b.keys() if k_a[k] == k_b[k]]
            print(f"{name}: kernels {len(k_a)} vs {len(k_b)}, {len(same)} with identical SASS")
            for k in sorted(k_a.keys() ^ k_b.keys())[:20]:
                problems.append(f"{name}: kernel only in {'A' if k in k_a else 'B'}: {k}")
            for k in sorted(k for k in k_a.keys() & k_b.keys() if k_a[k] != k_b[k])[:20]:
                problems.append(f"{name}: SASS differs: {k}")
    return problems


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    for p in problems:
        print("DIFFERENT:", p)
    print("identical" if not problems else f"{len(problems)} difference(s) (first 20 of each kind)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
