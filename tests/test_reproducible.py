"""Reproducible bytes (builder/artifact/reproducible.py, docs/reproducible.md): one build key, built
twice in different work directories, cache roots, umasks and times, gives byte-identical
wheels; the compile cache serves what the compiler would write.

The unit tests run everywhere; the build test compares three builds of the CUDA fixture
(real nvcc, torch and pip): the session's cold build (tests/fixture_build.py: every unit
compiled, shared with tests/test_build_fixture.py); ccache with an empty cache (every unit
a miss, so it compiles); ccache again (every unit a hit).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from conftest import wheel_differences
from fixture_build import FixtureBuild
from wheelforge import _fs
from wheelforge.builder.artifact import reproducible
from wheelforge.builder.env import buildenv
from wheelforge.errors import ToolchainError


def _tar(path: Path, members: dict[str, int]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, mtime in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 1, mtime
            tf.addfile(info, io.BytesIO(b"x"))
    return path


def test_the_date_is_the_newest_member_of_the_source(tmp_path: Path) -> None:
    sdist = _tar(tmp_path / "p-1.tar.gz", {"p-1/a": 1_700_000_000, "p-1/b": 1_700_000_500})
    os.utime(sdist, (2_000_000_000, 2_000_000_000))  # the download's date is not the source's
    assert reproducible.source_date_epoch(sdist) == 1_700_000_500
    archive = tmp_path / "p.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(zipfile.ZipInfo("p-1/a", (2023, 11, 14, 22, 13, 20)), b"x")
    assert reproducible.source_date_epoch(archive) == 1_700_000_000
    # zip cannot date a member before 1980: an older (or zero) date is clamped
    assert reproducible.source_date_epoch(_tar(tmp_path / "old.tar", {"o/a": 0})) == \
        reproducible.MIN_EPOCH


@pytest.mark.integration
def test_a_git_archive_is_dated_by_its_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_DATE": "@1600000000 +0000",
           "GIT_COMMITTER_DATE": "@1650000000 +0200", "GIT_AUTHOR_NAME": "a",
           "GIT_AUTHOR_EMAIL": "a@a", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@a"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        if args[0] == "add":
            (repo / "f.py").write_text("x = 1\n")
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    out = tmp_path / "a.tar"
    subprocess.run(["git", "archive", "--format=tar", "--prefix=p/", "-o", str(out), "HEAD"],
                   cwd=repo, env=env, check=True)
    assert reproducible.source_date_epoch(out) == 1_650_000_000  # the committer's time


def test_fixed_paths_are_held_emptied_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "build-root"
    with reproducible.fixed_paths("p-1.0", root=root) as fixed:
        assert fixed.root == root / "p-1.0" and fixed.src == root / "p-1.0" / "src"
        assert oct(root.stat().st_mode & 0o7777) == "0o700"  # the user's alone
        fixed.src.mkdir()
        (fixed.src / "left").write_text("by a killed build")
    assert not (root / "p-1.0").exists()
    (root / "p-1.0" / "src").mkdir(parents=True)  # what a SIGKILLed build leaves
    (root / "p-1.0" / "src" / "stale").write_text("x")
    with reproducible.fixed_paths("p-1.0", root=root) as fixed:
        assert not fixed.src.exists()  # emptied before use


def test_two_builds_of_one_process_take_turns_at_the_fixed_path(tmp_path: Path) -> None:
    """The nightly's cells of one recipe version for two torches, built at once in
    threads: the second waits (and says so) until the first has left the path."""
    root = tmp_path / "build-root"
    events: list[str] = []
    busy: list[str] = []
    inside = threading.Event()

    def second() -> None:
        inside.wait(10)
        with reproducible.fixed_paths("p-1.0", root=root, on_busy=busy.append) as fixed:
            events.append("second in")
            assert not (fixed.root / "first").exists()

    t = threading.Thread(target=second)
    t.start()
    with reproducible.fixed_paths("p-1.0", root=root) as fixed:
        (fixed.root / "first").write_text("mine")
        inside.set()
        time.sleep(0.5)
        events.append("first out")
    t.join(10)
    assert events == ["first out", "second in"]
    assert busy and busy[0].startswith("another build of this command")


def test_a_link_at_the_fixed_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "build-root"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "p-1.0").symlink_to(elsewhere)
    with pytest.raises(ToolchainError, match="is not a directory of this user"), \
            reproducible.fixed_paths("p-1.0", root=root):
        pass
    assert elsewhere.is_dir()  # never followed, never removed


def test_a_failed_build_keeps_its_tree_in_the_work_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(RuntimeError), \
            reproducible.fixed_paths("p-1.0", root=tmp_path / "r") as fixed:
        (fixed.src / "p-1.0").mkdir(parents=True)
        (fixed.src / "p-1.0" / "setup.py").write_text("boom")
        try:
            raise RuntimeError("compile failed")
        except RuntimeError:
            fixed.keep(work)
            raise
    assert (work / "src" / "p-1.0" / "setup.py").read_text() == "boom"
    assert not (tmp_path / "r" / "p-1.0").exists()


def test_the_environment_is_reached_through_the_fixed_link(tmp_path: Path) -> None:
    venv = tmp_path / "cache" / "envs" / "abc"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").write_text("")
    with reproducible.fixed_paths("p-1.0", root=tmp_path / "r") as fixed:
        python = fixed.link_env(venv / "bin" / "python")
        assert python == tmp_path / "r" / "p-1.0" / "env" / "bin" / "python"
        assert python.resolve() == (venv / "bin" / "python").resolve()
        # not a venv (a system interpreter): used as it is, no link
        system = tmp_path / "usr" / "bin" / "python3"
        system.parent.mkdir(parents=True)
        system.write_text("")
        assert fixed.link_env(system) == system


def test_the_umask_is_set_and_given_back(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        with reproducible.umask():
            (tmp_path / "f").write_text("x")
        assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
        assert os.umask(0o077) == 0o077
    finally:
        os.umask(old)


@pytest.mark.integration
def test_nvcc_gets_objtemp_and_a_seed_when_it_knows_them(tmp_path: Path) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho '--keep (-keep)'\n")
    fake.chmod(0o755)
    assert reproducible.nvcc_flags(fake) == ()  # an nvcc without them: the build still runs
    fake.write_text("#!/bin/sh\necho '--objdir-as-tempdir                (-objtemp)'\n")
    assert reproducible.nvcc_flags(fake) == ("--objdir-as-tempdir",)
    fake.write_text("#!/bin/sh\necho '--objdir-as-tempdir (-objtemp)'\n"
                    "echo '--frandom-seed <seed>   (-frandom-seed)'\n")
    assert reproducible.nvcc_flags(fake) == ("--objdir-as-tempdir", "--frandom-seed=1")


@pytest.mark.nvcc
def test_the_real_nvcc_knows_objtemp_and_the_seed(nvcc: str) -> None:
    assert reproducible.nvcc_flags(Path(nvcc)) == ("--objdir-as-tempdir", "--frandom-seed=1")


#: A kernel template that uses cuda::std::begin: nvcc names the customization point objects
#: it instantiates ``_INTERNAL_<hash>_<file>_<hash>_<number>``, the number from its pid.
INTERNAL_NAMES_CU = """\
#include <cuda/std/array>
#include <cuda/std/iterator>
template <int N> __global__ void total(int* out) {
  cuda::std::array<int, N> a{};
  int s = 0;
  for (auto it = cuda::std::begin(a); it != cuda::std::end(a); ++it) s += *it;
  *out = s;
}
template __global__ void total<4>(int*);
"""


@pytest.mark.nvcc
def test_the_seed_keeps_the_process_id_out_of_nvccs_internal_names(
        tmp_path: Path, nvcc: str) -> None:
    """mamba-ssm's units have such names: without the seed, two compiles of one unit
    differed in its fatbin (nvcc 13.0); with it they are the same bytes."""
    src, out = tmp_path / "k.cu", tmp_path / "k.o"
    src.write_text(INTERNAL_NAMES_CU)

    def compile_with(flags: tuple[str, ...]) -> bytes:
        subprocess.run([nvcc, *flags, "-arch=sm_120", "-std=c++17", "-c", str(src), "-o",
                        str(out)], check=True, capture_output=True, cwd=tmp_path, timeout=300)
        return out.read_bytes()

    without = (reproducible.NVCC_OBJTEMP,)
    assert compile_with(without) != compile_with(without)  # the fixture has such names
    flags = reproducible.nvcc_flags(Path(nvcc))
    assert compile_with(flags) == compile_with(flags)


def test_files_newer_than_the_source_are_dated_at_it_and_links_are_not_followed(
        tmp_path: Path) -> None:
    tree, outside = tmp_path / "src", tmp_path / "outside.txt"
    (tree / "csrc").mkdir(parents=True)
    for path, mtime in ((tree / "old.cu", 1_000), (tree / "csrc" / "patched.cu", 9_000)):
        path.write_text("x")
        os.utime(path, (mtime, mtime))
    outside.write_text("not the tree's")
    os.utime(outside, (9_000, 9_000))
    (tree / "link").symlink_to(outside)
    changed = _fs.date_tree(tree, 5_000)
    assert os.stat(tree / "old.cu").st_mtime == 1_000  # older than the source: kept
    assert os.stat(tree / "csrc" / "patched.cu").st_mtime == 5_000
    assert os.lstat(tree / "link").st_mtime == 5_000  # the link itself ...
    assert os.stat(outside).st_mtime == 9_000  # ... never what it points at
    assert os.stat(tree / "csrc").st_mtime == os.stat(tree).st_mtime == 5_000
    assert changed == 4  # patched.cu, link, csrc/, the tree
    assert _fs.date_tree(tree, 5_000) == 0
    assert _fs.date_tree(tmp_path / "absent", 5_000) == 0


def test_a_managed_environments_torch_headers_are_dated_at_the_zip_epoch(
        tmp_path: Path) -> None:
    include = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "torch" / "include"
    (include / "c10").mkdir(parents=True)
    (include / "c10" / "Half.h").write_text("x")
    module = include.parent / "__init__.py"
    module.write_text("x")  # torch's Python files keep their dates (their .pyc check them)
    assert buildenv.date_headers(tmp_path / "env") == 3  # Half.h, c10/, include/
    assert os.stat(include / "c10" / "Half.h").st_mtime == _fs.ZIP_EPOCH
    assert os.stat(module).st_mtime > _fs.ZIP_EPOCH
    assert buildenv.date_headers(tmp_path / "env") == 0


LINEINFO_CU = """\
__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }
"""


@pytest.mark.nvcc
def test_lineinfo_holds_a_sources_date_and_the_clamp_takes_it_out(
        tmp_path: Path, nvcc: str) -> None:
    """causal-conv1d's cold builds differed in every unit's cubin by the dates of the
    files its patches rewrote: ``-lineinfo`` puts each source file's modification time
    in the line table.  Dated at the source's epoch, two compiles are the same bytes."""
    src, out = tmp_path / "k.cu", tmp_path / "k.o"
    src.write_text(LINEINFO_CU)
    flags = reproducible.nvcc_flags(Path(nvcc))

    def compile_at(mtime: int) -> bytes:
        os.utime(src, (mtime, mtime))
        subprocess.run([nvcc, *flags, "-lineinfo", "-arch=sm_120", "-c", str(src), "-o",
                        str(out)], check=True, capture_output=True, cwd=tmp_path, timeout=300)
        return out.read_bytes()

    assert compile_at(1_800_000_000) != compile_at(1_800_000_999)  # the date is in it
    dated = []
    for mtime in (1_800_000_000, 1_800_000_999):  # a patch rewrote it at two times ...
        os.utime(src, (mtime, mtime))
        _fs.date_tree(tmp_path, 1_700_000_000)  # ... dated at the source's
        dated.append(compile_at(int(os.stat(src).st_mtime)))
    assert dated[0] == dated[1]


# -- the whole build, twice (three times) -----------------------------------------------

def _build(project: Path, cache: Path, work: Path, index: Path, *, compile_cache: str,
           umask: int, epoch: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "SOURCE_DATE_EPOCH")}
    env["WHEELFORGE_COMPILE_CACHE"] = compile_cache
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = epoch  # a builder's own: not the source's, so ignored
    return subprocess.run(
        [sys.executable, "-m", "wheelforge", "build", "tinyext", "tinypure", "--arch", "12.0",
         "--recipes", str(project / "recipes"), "--sources", str(project / "sdists"),
         "--index", str(index), "--cache-dir", str(cache), "--work-dir", str(work),
         "--no-stack-check"],
        cwd=project, env=env, capture_output=True, text=True, timeout=1800,
        preexec_fn=lambda: os.umask(umask))  # noqa: PLW1509 (no threads started here)


def _wheels(index: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted((index / "files").glob("*.whl"))}


@pytest.mark.nvcc
def test_one_build_key_built_elsewhere_gives_the_same_bytes(
        tmp_path: Path, shared_cache: Path, nvcc: str, tinyext_cold: FixtureBuild) -> None:
    # A: the session's cold build (tests/fixture_build.py): the user's cache root, its own
    # project directory, umask 022, every unit compiled (ccache told to compile again)
    a, project = tinyext_cold.result, tinyext_cold.project
    assert a.returncode == 0, a.stderr[-3000:]
    assert "SOURCE_DATE_EPOCH=" in a.stderr and "(a fixed path)" in a.stderr
    time.sleep(2)  # zip dates have a 2 s resolution: B is built at another time, and
    # applies tinyext's patch (-lineinfo: the device code holds its file's date) then
    # B: another cache root (its managed environments linked from the first: same torch,
    # another path on every command line), a deeper work directory, umask 077, a
    # SOURCE_DATE_EPOCH of the builder's own, and ccache with an empty cache: every unit
    # a miss, so the wheel is compiled again, through ccache
    cache_b = tmp_path / "another" / "cache-root"
    cache_b.mkdir(parents=True)
    (cache_b / "envs").symlink_to(shared_cache / "envs", target_is_directory=True)
    b = _build(project, cache_b, tmp_path / "x" / "y" / "work-b", tmp_path / "index-b",
               compile_cache="ccache", umask=0o077, epoch="1")
    assert b.returncode == 0, b.stderr[-3000:]
    assert "compile cache: 0 hits, 2 misses" in b.stderr
    # C: B's cache root again from yet another work directory: every unit a hit
    c = _build(project, cache_b, tmp_path / "work-c", tmp_path / "index-c",
               compile_cache="ccache", umask=0o022)
    assert c.returncode == 0, c.stderr[-3000:]
    assert "compile cache: 2 hits, 0 misses" in c.stderr

    wa, wb, wc = _wheels(tinyext_cold.index), *(_wheels(tmp_path / f"index-{x}") for x in "bc")
    assert list(wa) == list(wb) == list(wc) and len(wa) == 2, (wa, wb, wc)
    for name in wa:
        assert wheel_differences(wa[name], wb[name]) == []
        assert wheel_differences(wa[name], wc[name]) == []
    # what B's umask would have changed: the members keep 0644/0755
    with zipfile.ZipFile(next(p for n, p in wb.items() if n.startswith("tinyext"))) as zf:
        modes = {oct(i.external_attr >> 16 & 0o777) for i in zf.infolist()}
    assert modes <= {"0o644", "0o755"}, modes
