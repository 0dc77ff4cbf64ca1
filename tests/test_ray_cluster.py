"""`wheelforge nightly --executor ray` on a real Ray cluster on 127.0.0.1.

A head node (no CPUs: it builds nothing) and two builder nodes are started with
`ray start`, each builder with its own WHEELFORGE_CACHE at another path (the managed
torch environments and sources are the user's, linked in), and stopped with `ray stop`
after.  The driver plans, Ray runs one task per cell on the builders, the driver
publishes: every cell built exactly once, one index, one report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import servers
from conftest import IN_CI, tinyext_project
from test_nightly import clean_env, pure_project, wheelforge, write_matrix
from wheelforge.nightly import fanout, rayexec

pytestmark = pytest.mark.e2e


def _ray_cli() -> str:
    found = Path(sys.executable).parent / "ray"
    if found.is_file():
        return str(found)
    if IN_CI:
        pytest.fail("ray is required under CI=true (pip install '.[test]' installs it)")
    pytest.skip("ray is not installed (pip install 'wheelforge[ray]')")


def _ray(cli: str, *args: str, env: dict[str, str] | None = None) -> None:
    res = subprocess.run([cli, *args], env=env or clean_env(), capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, f"ray {' '.join(args)}: {res.stdout[-2000:]}{res.stderr[-2000:]}"


def _builder_cache(root: Path, shared: Path) -> Path:
    cache = root / "cache"
    cache.mkdir(parents=True)
    for sub in ("envs", "sources"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(shared / sub)
    return cache


@pytest.fixture(scope="module")
def cluster(shared_cache: Path) -> Iterator[tuple[str, list[Path]]]:
    """``(address, [cache of builder 1, cache of builder 2])`` of a running cluster, started
    once for the module's tests (a start is about 30 s on 2 cores): each test counts only
    the logs its own cells left."""
    cli = _ray_cli()
    # a short temporary directory: Ray's Unix sockets live under it (108-byte limit)
    tmp = Path(tempfile.mkdtemp(prefix="wfray-"))
    port = servers.free_port()
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats",
              "--object-store-memory", str(100 * 1024 * 1024)]
    caches = []
    try:
        _ray(cli, "start", "--head", "--port", str(port), "--num-cpus", "0",
             "--include-dashboard=false", "--temp-dir", str(tmp / "ray"), *common)
        for name in ("builder-1", "elsewhere/builder-2"):
            cache = _builder_cache(tmp / name, shared_cache)
            env = {**clean_env(), "WHEELFORGE_CACHE": str(cache)}
            _ray(cli, "start", "--address", address, "--num-cpus", "1", "--resources",
                 json.dumps({rayexec.BUILDER_RESOURCE: 1}), *common, env=env)
            caches.append(cache)
        yield address, caches
    finally:
        subprocess.run([cli, "stop", "--force"], env=clean_env(), capture_output=True,
                       timeout=180)
        shutil.rmtree(tmp, ignore_errors=True)


def test_every_cell_built_once_on_the_cluster_one_index_one_report(
        tmp_path: Path, cluster: tuple[str, list[Path]]) -> None:
    address, caches = cluster
    earlier = {p for c in caches for p in (c / "logs").glob("*.log")}  # another test's cells
    names = ["purea", "pureb", "purec", "pured"]
    for name in names:
        pure_project(tmp_path, name)
    write_matrix(tmp_path, names, [{"spec": "torch==2.14.1", "cuda": "13.0"}], ["12.0"])
    res = wheelforge("nightly", "--executor", "ray", "--ray-address", address,
                     "--config", tmp_path / "wheelforge.yaml", "--recipes",
                     tmp_path / "recipes", "--sources", tmp_path / "sdists", "--index",
                     tmp_path / "index", "--cache-dir", tmp_path / "driver-cache", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert sorted((c["recipe"], c["status"]) for c in report["cells"]) == [
        (n, "built") for n in names]
    assert sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl")) == [
        f"{n}-0.1.0+wf-py3-none-any.whl" for n in names]
    # each cell built exactly once, on the builders' own caches, and on both builders
    logs = {c: sorted(p.name for p in (c / "logs").glob("*.log") if p not in earlier)
            for c in caches}
    assert sum(len(v) for v in logs.values()) == len(names), logs
    assert all(logs.values()), f"one builder got every cell: {logs}"
    where = [c["note"] for c in report["cells"]]
    assert all(any(str(c) in n for c in caches) for n in where), where
    assert not (tmp_path / "driver-cache" / "logs").exists()  # the driver built nothing
    assert len(list((tmp_path / "index" / "reports").glob("nightly-2*.json"))) == 1
    # the next night plans nothing: every key is published
    again = wheelforge("nightly", "plan", "--config", tmp_path / "wheelforge.yaml",
                       "--recipes", tmp_path / "recipes", "--index", tmp_path / "index",
                       "--cache-dir", tmp_path / "driver-cache", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["cells"] == []
    durations = json.loads((tmp_path / "driver-cache" / "stats" / "durations.json").read_text())
    assert len(durations) == len(names)


def test_a_cluster_without_builders_is_refused(tmp_path: Path) -> None:
    plan = fanout.Plan(created="", config="", index="", cells=(fanout.PlannedCell(
        id=0, recipe="r", version="1", python=None, torch="torch", cuda="13.0", pip_args=(),
        archs=None, build_key="0" * 64, toolchain={}),))

    class FakeRay:
        @staticmethod
        def nodes() -> list[dict[str, object]]:
            return [{"Alive": True, "Resources": {"CPU": 4.0}}]

    with pytest.raises(Exception, match="no node of the Ray cluster offers"):
        rayexec._check_capacity(FakeRay, plan, None)


@pytest.mark.nvcc
def test_the_cuda_fixture_builds_on_a_ray_node(tmp_path: Path, nvcc: str,
                                               cluster: tuple[str, list[Path]]) -> None:
    address, caches = cluster
    tinyext_project(tmp_path)
    pure_project(tmp_path, "purea")
    write_matrix(tmp_path, ["tinyext", "purea"], [{"spec": "torch==2.14.1", "cuda": "13.0"}],
                 ["12.0"])
    res = wheelforge("nightly", "--executor", "ray", "--ray-address", address, "--jobs", "1",
                     "--config", tmp_path / "wheelforge.yaml", "--recipes",
                     tmp_path / "recipes", "--sources", tmp_path / "sdists", "--index",
                     tmp_path / "index", "--cache-dir", tmp_path / "driver-cache", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    cells = {c["recipe"]: c for c in report["cells"]}
    assert {r: c["status"] for r, c in cells.items()} == {"tinyext": "built", "purea": "built"}
    assert cells["tinyext"]["archs_found"] == ["sm_120"]
    assert cells["tinyext"]["note"].startswith("compile cache: ")
    assert any(str(c) in cells["tinyext"]["note"] for c in caches)
    wheels = sorted(p.name for p in (tmp_path / "index" / "files").glob("*.whl"))
    assert len(wheels) == 2 and wheels[0] == "purea-0.1.0+wf-py3-none-any.whl"
    assert wheels[1].startswith("tinyext-0.1.0+cu130torch2.14sm120-cp3"), wheels


def test_an_address_nobody_answers_is_refused_at_once() -> None:
    port = servers.free_port()  # nothing listens there
    with pytest.raises(Exception, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        rayexec._probe(f"127.0.0.1:{port}")
    rayexec._probe("auto")  # left to Ray, which answers at once
