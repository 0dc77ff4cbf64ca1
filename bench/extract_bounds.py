#!/usr/bin/env python3
"""Safe bounded extraction against tarfile's own, side by side, and the bombs it stops.

In one run on one machine:
  1. a flash-attn-sized sdist (default 10,000 files, 100 MB unpacked, as CUTLASS makes
     it) extracted by `tarfile.extractall(filter="data")` (A) and by
     `wheelforge.builder.source.archive.extract` (B), alternating, best of --repeat; prints B/A;
  2. the hostile archives of issue 16 with the default bounds: a zip of one member
     declaring 1 GiB of zeros (~1 MiB packed), a tar.gz of 100,001 empty files, and a
     truncated tar.gz; prints the time to the SourceError and the bytes left behind.

    .venv/bin/python bench/extract_bounds.py [--files 10000] [--mib 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from wheelforge.builder.source.archive import extract  # noqa: E402
from wheelforge.errors import SourceError  # noqa: E402


def make_sdist(path: Path, files: int, mib: int) -> None:
    size = mib * (1 << 20) // files
    with tarfile.open(path, "w:gz", compresslevel=6) as tf:
        for i in range(files):
            noise = os.urandom(size // 12)  # a twelfth noise: packs ~12:1, as CUTLASS does
            data = noise + bytes(size - len(noise))
            ti = tarfile.TarInfo(f"flash_attn-2.8.3/csrc/cutlass/d{i % 97}/f{i}.h")
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="wf-bench-extract-") as tmp:
        base = Path(tmp)
        sdist = base / "flash_attn-2.8.3.tar.gz"
        make_sdist(sdist, args.files, args.mib)
        print(f"sdist: {args.files} files, {args.mib} MiB unpacked, "
              f"{sdist.stat().st_size / (1 << 20):.1f} MiB packed")
        a, b = [], []
        for i in range(args.repeat):
            for label, out in (("A", base / f"a{i}"), ("B", base / f"b{i}")):
                if label == "A":
                    def run_a(out: Path = out) -> None:
                        with tarfile.open(sdist) as tf:
                            tf.extractall(out, filter="data")
                    a.append(timed(run_a))
                else:
                    b.append(timed(lambda out=out: extract(sdist, out)))  # type: ignore[misc]
                shutil.rmtree(out)
        print(f"A tarfile data filter: best {min(a):.2f} s; B wheelforge: best {min(b):.2f} s; "
              f"B/A {min(b) / min(a):.2f}")

        bomb = base / "bomb-1.0.zip"
        with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
                zf.open("bomb-1.0/zeros.bin", "w", force_zip64=True) as f:
            chunk = bytes(1 << 20)
            for _ in range(1024):
                f.write(chunk)
        many = base / "many-1.0.tar.gz"
        with tarfile.open(many, "w:gz") as tf:
            for i in range(100_001):
                ti = tarfile.TarInfo(f"many-1.0/f{i}")
                tf.addfile(ti, io.BytesIO(b""))
        short = base / "short-2.8.3.tar.gz"
        short.write_bytes(sdist.read_bytes()[: sdist.stat().st_size // 2])
        for archive in (bomb, many, short):
            out = base / f"out-{archive.stem}"
            t = time.perf_counter()
            try:
                extract(archive, out)
                outcome = "extracted (!)"
            except SourceError as exc:
                outcome = f"SourceError: {exc.what} ({exc.why[:60]})"
            dt = time.perf_counter() - t
            print(f"{archive.name} ({archive.stat().st_size / (1 << 20):.2f} MiB): {dt:.2f} s, "
                  f"{du(out)} bytes left: {outcome}")


if __name__ == "__main__":
    main()
