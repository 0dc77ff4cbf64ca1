"""Issue 54 item 2: a matrix pin that names a system toolkit (``toolkit: {cuda-home: PATH,
label: NAME}``, what a CUDA 12 torch needs) has its cells built only on the Ray nodes that
declare that label as a resource, with that toolkit.

The real CUDA 13 toolkit at two paths stands in for two toolkits (no CUDA 12 toolkit is
on this machine): ``/usr/local/cuda`` (a link), what a builder without the label finds,
and the directory it leads to, ``/usr/local/cuda-13.0``, the pin's.  A real Ray cluster on
127.0.0.1: two builder nodes (the head one of them), one declaring the label; each node
is a ``ray start --block`` process of this test, ended by its own process id (never
``ray stop``, which ends every Ray process of the user).  The CUDA fixture is the build.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

import servers
from conftest import IN_CI, tinyext_project
from test_nightly import clean_env, pure_project, wheelforge
from test_ray_cluster import _builder_cache, _ray_cli
from wheelforge.nightly import rayexec

pytestmark = pytest.mark.e2e
LABEL = "cuda-toolkit-13.0-real"


def _start(cli: str, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``ray start --block ARGS``, waited for until its runtime is up."""
    out = log.open("wb")
    # a loaded machine (2 shared cores) registers a node slowly: Ray's 30 s are too few
    env = {**env, "RAY_raylet_start_wait_time_s": "180"}
    proc = subprocess.Popen([cli, "start", "--block", *args], stdout=out,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    while b"Ray runtime started" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            _end(proc)
            raise AssertionError(f"ray start {' '.join(args)}: {log.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The node's process tree, ended by process id."""
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in reversed(tree):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(tree, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    proc.wait(timeout=30)


@contextlib.contextmanager
def labelled_cluster(shared: Path) -> Iterator[tuple[str, list[Path]]]:
    """``(address, [cache of the plain builder, cache of the labelled one])``."""
    cli = _ray_cli()
    tmp = Path(tempfile.mkdtemp(prefix="wfrayt-"))  # short: Ray's Unix sockets live under it
    port = servers.free_port()
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats",
              "--object-store-memory", str(100 * 1024 * 1024)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # two nodes (the head builds too: a third raylet times out on 2 loaded cores)
        caches = []
        for name, extra in (("plain", {}), ("labelled", {LABEL: 1})):
            cache = _builder_cache(tmp / name, shared)
            env = {**clean_env(), "WHEELFORGE_CACHE": str(cache)}
            env.pop("CUDA_HOME", None)
            resources = json.dumps({rayexec.BUILDER_RESOURCE: 1, **extra})
            where = (["--head", "--port", str(port), "--include-dashboard=false",
                      "--temp-dir", str(tmp / "ray")] if not procs else ["--address", address])
            procs.append(_start(cli, [*where, "--num-cpus", "1", "--resources", resources,
                                      *common], tmp / f"{name}.log", env))
            caches.append(cache)
        yield address, caches
    finally:
        for proc in reversed(procs):
            _end(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def write_matrix(root: Path, label: str, home: Path) -> Path:
    path = root / f"matrix-{label}.yaml"
    path.write_text(yaml.safe_dump({"matrix": {
        "recipes": ["tinyext", "purea"], "archs": ["12.0"],
        "torch": [{"spec": "torch==2.14.1", "cuda": "13.0",
                   "toolkit": {"cuda-home": str(home), "label": label}}]}}, sort_keys=False))
    return path


def second_path() -> Path:
    """/usr/local/cuda-13.0, the directory /usr/local/cuda links to."""
    real = Path(os.path.realpath("/usr/local/cuda"))
    if real == Path("/usr/local/cuda") or not (real / "bin" / "nvcc").exists():
        why = "/usr/local/cuda is not a link to a versioned CUDA 13 toolkit (a second path)"
        if IN_CI:
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    return real


def args_of(root: Path) -> list[str | Path]:
    tinyext_project(root)
    pure_project(root, "purea")
    return ["--recipes", root / "recipes", "--sources", root / "sdists", "--index",
            root / "index", "--cache-dir", root / "driver-cache"]


def test_a_cluster_without_the_pins_label_is_refused_before_anything_runs(
        tmp_path: Path, shared_cache: Path) -> None:
    real = second_path()
    args = args_of(tmp_path)
    with labelled_cluster(shared_cache) as (address, _caches):
        nowhere = wheelforge("nightly", "--executor", "ray", "--ray-address", address,
                             "--config", write_matrix(tmp_path, "cuda-toolkit-12.8", real),
                             *args, cwd=tmp_path)
    assert nowhere.returncode == 2, nowhere.stdout[-3000:] + nowhere.stderr[-3000:]
    assert "no builder node declares 'cuda-toolkit-12.8'" in nowhere.stderr
    assert "Traceback" not in nowhere.stderr
    assert not list((tmp_path / "index").glob("files/*.whl"))


@pytest.mark.nvcc
def test_a_pins_toolkit_cell_is_built_only_where_a_node_declares_it(
        tmp_path: Path, nvcc: str, shared_cache: Path) -> None:
    real = second_path()
    args = args_of(tmp_path)
    with labelled_cluster(shared_cache) as (address, caches):
        res = wheelforge("nightly", "--executor", "ray", "--ray-address", address, "--jobs",
                         "1", "--config", write_matrix(tmp_path, LABEL, real), *args,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    cells = {c["recipe"]: c for c in report["cells"]}
    assert {r: c["status"] for r, c in cells.items()} == {"tinyext": "built", "purea": "built"}
    plain, labelled = caches
    assert f"built on vm:{labelled}" in cells["tinyext"]["note"] or str(labelled) in cells[
        "tinyext"]["note"], cells["tinyext"]["note"]
    assert str(plain) not in cells["tinyext"]["note"]
    # the published build log: torch's extension builder and nvcc at the pin's path
    log = (tmp_path / "index" / "reports" / "logs").glob("tinyext-*.log")
    text = next(log).read_text(errors="replace")
    assert f"using CUDA_HOME='{real}'" in text
    assert f" {real}/bin/nvcc " in text and "/usr/local/cuda/bin/nvcc" not in text
    wheels = sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl"))
    assert len(wheels) == 2 and wheels[1].startswith("tinyext-0.1.0+cu130torch2.14sm120-")
