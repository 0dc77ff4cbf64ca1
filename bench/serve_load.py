#!/usr/bin/env python3
"""`wheelforge serve` and the documented nginx configuration under a team's load.

In one run, on one machine:

1. generates an index of N wheels (default 10,000: 500 projects x 20 versions) with
   bench/index_bench.py's generator and index.rebuild;
2. starts `wheelforge serve` (its own process, default limits) and nginx with the
   configuration of docs/index.md (2 workers, worker_connections 4096) on 127.0.0.1;
3. against each: C concurrent clients (default 500), started at once, each on one
   keep-alive connection fetching what pip fetches to install one project: the root page
   /simple/ (HTML), a project page as HTML and as PEP 691 JSON, and one .metadata file.
   Every response is checked (status 200, its length that of the file on disk); a client
   fails on any other status, a reset, or when it is not done within 60 s.  Latency is per request,
   from the first byte sent (the connect included for a connection's first request) to
   the last byte received;
4. the same again while H half-open connections (default 300) are held: each has sent
   part of a request head and then nothing.  It reports when the server closed them,
   counted from their last byte (goal: within the idle timeout, 10 s for both servers).

The load generator is a separate asyncio process, so it does not share the server's
interpreter.  The machine's load average is printed before and after: on a shared
machine, other work competes with both.

    .venv/bin/python bench/serve_load.py [--wheels 10000] [--clients 500] [--half-open 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
PIP_ACCEPT = (f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01")
IDLE_TIMEOUT = 10


# --------------------------------------------------------------------------- the client


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def one_client(port: int, requests: list[tuple[str, str, int]],
                     latencies: list[float], errors: list[str]) -> None:
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        errors.append(f"connect: {exc}")
        return
    try:
        for path, accept, size in requests:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nAccept: {accept}\r\n"
                         f"User-Agent: bench\r\n\r\n".encode())
            status, body = await read_response(reader)
            now = time.perf_counter()
            latencies.append(now - start)
            start = now
            if status != 200 or len(body) != size:
                errors.append(f"{path}: {status}, {len(body)} bytes (expected {size})")
                return  # a client fails once
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        writer.close()


async def hold_half_open(port: int, count: int
                         ) -> list[tuple[asyncio.StreamReader, float, asyncio.StreamWriter]]:
    held = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /simple/ HTTP/1.1\r\nHost: bench\r\nAccept: text/ht")
        await writer.drain()
        held.append((reader, time.perf_counter(), writer))
    return held


async def closed_after(reader: asyncio.StreamReader, since: float, limit: float) -> float | None:
    try:
        await asyncio.wait_for(reader.read(), limit)
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.perf_counter() - since


async def load(port: int, clients: int, half_open: int, plan: list[list[tuple[str, str, int]]]
               ) -> dict[str, object]:
    held = await hold_half_open(port, half_open) if half_open else []
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    tasks = [one_client(port, plan[i % len(plan)], latencies, errors) for i in range(clients)]
    done, pending = await asyncio.wait([asyncio.ensure_future(t) for t in tasks], timeout=60)
    for task in pending:
        task.cancel()
        errors.append("not done within 60 s")
    wall = time.perf_counter() - start
    closes = await asyncio.gather(*(closed_after(r, t, IDLE_TIMEOUT + 20) for r, t, _ in held))
    return {"requests": len(latencies), "errors": errors[:5], "error_count": len(errors),
            "wall": wall, "latencies": sorted(latencies),
            "half_open_closed": [c for c in closes if c is not None],
            "half_open_still_open": sum(c is None for c in closes)}


def client_main(args: argparse.Namespace) -> None:
    plan = json.loads(Path(args.plan).read_text())
    result = asyncio.run(load(args.port, args.clients, args.half_open, plan))
    print(json.dumps(result))


# --------------------------------------------------------------------------- the servers


def start_serve(root: Path, package: Path | None = None) -> tuple[subprocess.Popen[str], int]:
    """`wheelforge serve` of this checkout, or of the source tree ``package`` (a baseline)."""
    env = dict(os.environ)
    argv = [sys.executable, "-m", "wheelforge", "serve", "--index", str(root), "--port", "0"]
    if package is None:
        argv += ["--idle-timeout", str(IDLE_TIMEOUT)]
    else:
        env["PYTHONPATH"] = str(package)
    proc = subprocess.Popen(argv, env=env, cwd=package or REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not match:
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        sys.exit(f"wheelforge serve did not start: {line}{err}")
    return proc, int(match.group(1))


def start_nginx(prefix: Path, root: Path) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    (block,) = re.findall(r"```nginx\n(.*?)```", (REPO / "docs/index.md").read_text(), re.S)
    block = block.replace("    listen 8080;", f"    listen 127.0.0.1:{port};")
    block = block.replace("    root /srv/wheelforge/index;", f"    root {root};")
    (prefix / "logs").mkdir(parents=True)
    (prefix / "site.conf").write_text(block)
    temps = "\n".join(f"    {k}_temp_path {prefix}/{k};"
                      for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (prefix / "nginx.conf").write_text(
        f"{'user root;' if os.geteuid() == 0 else ''}\nworker_processes 2;\n"
        f"pid {prefix}/nginx.pid;\nerror_log {prefix}/logs/error.log;\n"
        "events { worker_connections 4096; }\n"
        f"http {{\n    access_log off;\n{temps}\n    include {prefix}/site.conf;\n}}\n")
    proc = subprocess.Popen(["/usr/sbin/nginx", "-p", str(prefix), "-e",
                             str(prefix / "logs/error.log"), "-c", str(prefix / "nginx.conf"),
                             "-g", "daemon off;"])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit("nginx did not start: " + (prefix / "logs/error.log").read_text())


def stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- the run


def plan_for(root: Path, projects: list[str]) -> list[list[tuple[str, str, int]]]:
    from packaging.utils import canonicalize_name

    plans = []
    simple = root / "simple"
    root_size = (simple / "index.html").stat().st_size
    for name in projects:
        project = canonicalize_name(name)
        page = simple / project
        metadata = sorted((root / "files").glob(f"{project.replace('-', '_')}-*.metadata"))[0]
        plans.append([
            ("/simple/", "text/html", root_size),
            (f"/simple/{project}/", "text/html", (page / "index.html").stat().st_size),
            (f"/simple/{project}/", PIP_ACCEPT, (page / "index.json").stat().st_size),
            (f"/files/{metadata.name}", "*/*", metadata.stat().st_size),
        ])
    return plans


def run_client(port: int, plan: Path, clients: int, half_open: int) -> dict[str, object]:
    done = subprocess.run([sys.executable, __file__, "--client", "--port", str(port),
                           "--plan", str(plan), "--clients", str(clients),
                           "--half-open", str(half_open)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"the load generator failed:\n{done.stderr}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report(label: str, r: dict[str, object], expected: int) -> str:
    lat = r["latencies"]
    assert isinstance(lat, list)
    closed = r["half_open_closed"]
    assert isinstance(closed, list)
    text = (f"  {label:<34} {r['requests']:>5}/{expected} answered, {r['error_count']} "
            f"clients failed, "
            f"p50 {pct(lat, 0.5) * 1000:6.1f} ms, p99 {pct(lat, 0.99) * 1000:6.1f} ms, "
            f"max {max(lat, default=0) * 1000:6.1f} ms, all in {r['wall']:.2f} s")
    if closed or r["half_open_still_open"]:
        text += (f"\n  {'':<34} half-open: {len(closed)} closed after "
                 f"{min(closed, default=0):.1f}-{max(closed, default=0):.1f} s "
                 f"(median {statistics.median(closed) if closed else 0:.1f} s), "
                 f"{r['half_open_still_open']} still open after {IDLE_TIMEOUT + 20} s")
    if r["errors"]:
        text += f"\n  {'':<34} first errors: {r['errors']}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=500)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--half-open", type=int, default=300)
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run `wheelforge serve` of this git revision, e.g. main")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return

    from index_bench import generate

    from wheelforge import index

    work = args.dir or Path(tempfile.mkdtemp(prefix="wf-serve-load-"))
    root = work / "index"
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()} at the start")
    t = time.perf_counter()
    names = generate(root, args.wheels, args.projects)
    index.rebuild(root)
    print(f"index of {args.wheels} wheels, {len(names)} projects in {time.perf_counter() - t:.1f}"
          f" s; /simple/index.html {(root / 'simple/index.html').stat().st_size} bytes")
    plan = work / "plan.json"
    plan.write_text(json.dumps(plan_for(root, names)))
    expected = args.clients * 4
    print(f"{args.clients} clients x 4 requests (root HTML, project HTML, project JSON, one "
          f".metadata), on one keep-alive connection each; idle timeout {IDLE_TIMEOUT} s")
    servers = [("wheelforge serve", lambda: start_serve(root)),
               ("nginx (docs/index.md)", lambda: start_nginx(work / "nginx", root))]
    if args.baseline:
        tree = work / "baseline"
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "src"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        servers.append((f"serve of {args.baseline}", lambda: start_serve(root, tree / "src")))
    p99: dict[str, float] = {}
    for label, starter in servers:
        proc, port = starter()
        try:
            run_client(port, plan, 20, 0)  # warm the page cache and the server
            plain = run_client(port, plan, args.clients, 0)
            print(report(f"{label}", plain, expected), flush=True)
            held = run_client(port, plan, args.clients, args.half_open)
            print(report(f"{label}, {args.half_open} half-open", held, expected), flush=True)
            for key, r in (("", plain), (" half-open", held)):
                lat = r["latencies"]
                assert isinstance(lat, list)
                p99[label + key] = pct(lat, 0.99)
        finally:
            stop(proc)
    for key in ("", " half-open"):
        ratio = p99["wheelforge serve" + key] / p99["nginx (docs/index.md)" + key]
        print(f"p99 of wheelforge serve / nginx{key}: {ratio:.2f}x")
    print(f"load average {os.getloadavg()} at the end")


if __name__ == "__main__":
    main()
