#!/usr/bin/env python3
"""The local index at scale: publish, rebuild and pip's resolve time, with 10,000 wheels.

In one run, on one machine:

1. generates an index of N wheels (default 10,000: 500 projects x 20 versions, two
   thirds of them in the channels cu130-torch2.14 and cu128-torch2.14, the rest
   channel-less).  The wheels are small valid zips written directly, and so are their
   files/<wheel>.metadata and files/<wheel>.wf.json sidecars: the same bytes
   index.publish writes (the record is built with index.WheelRecord and serialized
   with index.to_json), but without its lock, fsyncs and page updates, which would
   make generating 10,000 wheels take minutes.  No page exists yet at this point;
2. times index.rebuild: every page generated from files/ and the sidecars
   (goal < 2 s), then once more with every page already in place;
3. times index.publish of one more wheel into that index (goal < 0.2 s), for five
   kinds of wheel: a new version of a channel project, of another channel, of a pure
   channel-less project, a new project, and the same bytes again (a no-op);
4. times pip resolving one project, `pip install --dry-run --no-deps --ignore-installed
   --report`, against the index (file:// and over HTTP via make_server) and against a
   plain --find-links directory holding the same 10,000 wheels (hard links), and prints
   the ratio.  Best of --repeat runs each.

    .venv/bin/python bench/index_bench.py [--wheels 10000] [--projects 500] [--dir DIR]
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from packaging.utils import canonicalize_name  # noqa: E402

from wheelforge import index  # noqa: E402

TARGETS = [
    {"channel": "cu130-torch2.14", "cuda": "13.0", "torch": "2.14.1", "archs": ("sm_120",),
     "label": "+cu130torch2.14sm120"},
    {"channel": "cu128-torch2.14", "cuda": "12.8", "torch": "2.14.1",
     "archs": ("sm_100", "sm_120"), "label": "+cu128torch2.14sm100sm120"},
    {"channel": None, "cuda": None, "torch": None, "archs": (), "label": ""},
]
UPLOAD_TIME = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
FIXED_DATE = (2025, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_bytes(name: str, version: str) -> tuple[str, bytes, bytes]:
    """(file name, wheel bytes, METADATA bytes) of a tiny valid pure wheel."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                f"Summary: benchmark wheel\nRequires-Python: >=3.9\n").encode()
    files = {
        f"{dist}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for member, data in files.items():
            zf.writestr(zipfile.ZipInfo(member, FIXED_DATE), data)
    return f"{dist}-{version}-py3-none-any.whl", buf.getvalue(), metadata


def generate(root: Path, wheels: int, projects: int) -> list[str]:
    """Write ``wheels`` wheels with their .metadata and sidecars; returns the project names."""
    files = root / "files"
    files.mkdir(parents=True)
    names = [f"bench-proj-{p:04d}" for p in range(projects)]
    per_project = -(-wheels // projects)
    written = 0
    for p, name in enumerate(names):
        for v in range(per_project):
            if written == wheels:
                break
            target = TARGETS[(p + v) % 3]
            version = f"1.{v}{target['label']}"
            filename, data, metadata = wheel_bytes(name, version)
            record = index.WheelRecord(
                filename=filename, project=canonicalize_name(name), version=version,
                sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                requires_python=">=3.9", upload_time=UPLOAD_TIME, channel=target["channel"],
                cuda=target["cuda"], torch=target["torch"], archs=target["archs"],
                build_key=f"key-{p}-{v}" if target["channel"] else None,
                metadata_sha256=hashlib.sha256(metadata).hexdigest(),
                summary="benchmark wheel",
            )
            (files / filename).write_bytes(data)
            (files / (filename + ".metadata")).write_bytes(metadata)
            (files / (filename + ".wf.json")).write_text(index.to_json(record))
            written += 1
    return names


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def figure(goal: float | None, wall: float, cpu: float) -> str:
    text = f"{wall:.3f} s (cpu {cpu:.3f} s)"
    if goal is not None:
        text += f"  goal < {goal:g} s: {'met' if wall < goal else 'MISSED'}"
    return text


def pip_resolve(args: list[str], project: str, report: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, NO_PROXY="127.0.0.1,localhost")
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
            "--ignore-installed", "--isolated", "--no-cache-dir", "--disable-pip-version-check",
            "--only-binary", ":all:", "--quiet", "--report", str(report), *args, project]
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pip failed: {' '.join(argv)}\n{done.stdout}{done.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", type=int, default=10_000)
    ap.add_argument("--projects", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3, help="pip runs per variant (best kept)")
    ap.add_argument("--dir", type=Path, help="work in DIR (kept) instead of a temp directory")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="wf-index-bench-", dir=args.dir) as tmp:
        root = Path(tmp) / "index"
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores (load average {load}), "
              f"index in {root}", flush=True)

        t = timed(lambda: generate(root, args.wheels, args.projects))
        print(f"generate {args.wheels} wheels + .metadata + sidecars "
              f"(direct writes, no pages): {figure(None, *t)}", flush=True)

        t = timed(lambda: index.rebuild(root))
        print(f"rebuild, every page written from scratch:   {figure(2, *t)}", flush=True)
        t = timed(lambda: index.rebuild(root))
        print(f"rebuild again, every page already in place: {figure(2, *t)}", flush=True)

        dist = Path(tmp) / "dist"
        dist.mkdir()
        cases = [
            ("new version, channel project", "bench-proj-0000", "9.0+cu130torch2.14sm120",
             TARGETS[0]),
            ("new version, other channel", "bench-proj-0001", "9.0+cu128torch2.14sm100sm120",
             TARGETS[1]),
            ("new version, pure channel-less", "bench-proj-0002", "9.0", TARGETS[2]),
            ("new project (channel)", "bench-new-project", "1.0+cu130torch2.14sm120",
             TARGETS[0]),
        ]
        for label, name, version, target in cases:
            filename, data, _metadata = wheel_bytes(name, version)
            last = dist / filename
            last.write_bytes(data)
            publish = functools.partial(
                index.publish, root, last, build_key="key-new" if target["channel"] else None,
                **{k: target[k] for k in ("channel", "cuda", "torch", "archs")})
            t = timed(publish)
            print(f"publish into {args.wheels} wheels, {label + ':':33} {figure(0.2, *t)}",
                  flush=True)
        t = timed(publish)  # the last one again
        print(f"publish into {args.wheels} wheels, {'same bytes again (no-op):':33} "
              f"{figure(None, *t)}")

        flat = Path(tmp) / "flat"
        flat.mkdir()
        for wheel in (root / "files").glob("*.whl"):
            os.link(wheel, flat / wheel.name)
        project = "bench-proj-0250"
        report = Path(tmp) / "report.json"
        variants: list[tuple[str, list[str]]] = [
            ("index, file://", ["--index-url", (root / "simple").as_uri() + "/"]),
            ("--find-links directory", ["--no-index", "--find-links", str(flat)]),
        ]
        httpd = index.make_server(root)
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            port = httpd.server_address[1]
            variants.insert(1, ("index, HTTP (make_server)",
                                ["--index-url", f"http://127.0.0.1:{port}/simple/"]))
            best = {}
            for label, extra in variants:
                best[label] = min(pip_resolve(extra, project, report)
                                  for _ in range(args.repeat))
                print(f"pip resolve {project} against {label + ':':27} {best[label]:.2f} s "
                      f"(best of {args.repeat})", flush=True)
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
        flat_time = best["--find-links directory"]
        for label in ("index, file://", "index, HTTP (make_server)"):
            print(f"ratio --find-links / {label}: {flat_time / best[label]:.2f}")
        baseline = min(timed(lambda: subprocess.run(
            [sys.executable, "-m", "pip", "--version"], capture_output=True, check=True))[0]
            for _ in range(args.repeat))
        print(f"(pip's own start-up, `pip --version`: {baseline:.2f} s, included in each)")


if __name__ == "__main__":
    main()
