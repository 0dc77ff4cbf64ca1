"""Honest platform tags: the manylinux policy a wheel's shared objects allow, found by
auditwheel's analysis with torch's and CUDA's libraries excluded and nothing grafted.

Real shared objects compiled here with gcc (no fakes of auditwheel): one that needs only
glibc gets a manylinux tag and keeps every byte; one that links a library no policy
allows keeps linux_x86_64 and says why.  The relabel gives the wheel the tag in its file
name and WHEEL file; the host compiler is part of the build key's toolchain.  auditwheel
changes its process's working directory while it reads a wheel, so the analysis runs in
a child: the builds of one command run in threads that read relative paths."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import make_wheel, require_tool
from wheelforge.builder.artifact.platform import platform_tag
from wheelforge.builder.compiling.toolchain import host_compiler
from wheelforge.wheel import check_wheel, relabel, relabeled_name

LINUX = "cp311-cp311-linux_x86_64"


def _compile(tmp_path: Path) -> tuple[bytes, bytes]:
    """(a .so needing glibc only, a .so linking libwfextra.so that no policy allows)."""
    gcc = require_tool("gcc")
    (tmp_path / "extra.c").write_text("int extra(void) { return 1; }\n")
    (tmp_path / "ext.c").write_text("#include <string.h>\nint extra(void);\n"
                                    "int ext(const char *s) { return (int)strlen(s) + extra(); }\n")
    (tmp_path / "plain.c").write_text("#include <string.h>\n"
                                      "int plain(const char *s) { return (int)strlen(s); }\n")
    run = [gcc, "-shared", "-fPIC", "-O1"]
    subprocess.run([*run, "-o", tmp_path / "libwfextra.so", tmp_path / "extra.c"], check=True)
    subprocess.run([*run, "-o", tmp_path / "plain.so", tmp_path / "plain.c"], check=True)
    subprocess.run([*run, "-o", tmp_path / "ext.so", tmp_path / "ext.c", f"-L{tmp_path}",
                    "-lwfextra"], check=True)
    return (tmp_path / "plain.so").read_bytes(), (tmp_path / "ext.so").read_bytes()


def test_a_glibc_only_extension_gets_a_manylinux_tag_unchanged(tmp_path: Path) -> None:
    plain, _ = _compile(tmp_path)
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": plain}, name="demo", tag=LINUX)
    found = platform_tag(wheel)
    assert found.manylinux and found.tag.startswith("manylinux_2_") and \
        found.tag.endswith("_x86_64"), found
    assert found.tag == found.policy and not found.note
    assert any(s.startswith("GLIBC_2.") for s in found.symbols), found.symbols
    out = relabel(wheel, tmp_path / "out", local="wf", torch_pin=None, platform=found.tag)
    assert out.name == f"demo-1.0+wf-cp311-cp311-{found.tag}.whl"
    assert out.name == relabeled_name(wheel.name, "wf", None, found.tag)
    with zipfile.ZipFile(out) as zf:
        assert zf.read("demo/_C.so") == plain  # nothing grafted, nothing patched
        assert f"Tag: cp311-cp311-{found.tag}" in zf.read("demo-1.0+wf.dist-info/WHEEL").decode()
    check_wheel(out)  # the WHEEL tags and the file name agree


def test_a_library_outside_every_policy_keeps_linux_x86_64_and_says_why(tmp_path: Path) -> None:
    _, ext = _compile(tmp_path)
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": ext}, name="demo", tag=LINUX)
    found = platform_tag(wheel)
    assert (found.tag, found.manylinux) == ("linux_x86_64", False)
    assert "no manylinux policy allows it; it keeps linux_x86_64" in found.note
    assert "libwfextra.so" in found.note


def test_torch_and_cuda_libraries_are_excluded_not_held_against_the_wheel(
        tmp_path: Path) -> None:
    gcc = require_tool("gcc")
    for name in ("c10", "torch_cpu"):  # stand-ins named as torch's libraries are
        (tmp_path / f"{name}.c").write_text(f"int {name}_f(void) {{ return 0; }}\n")
        subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp_path / f"lib{name}.so",
                        tmp_path / f"{name}.c"], check=True)
    (tmp_path / "op.c").write_text("int c10_f(void); int torch_cpu_f(void);\n"
                                   "int op(void) { return c10_f() + torch_cpu_f(); }\n")
    subprocess.run([gcc, "-shared", "-fPIC", "-o", tmp_path / "op.so", tmp_path / "op.c",
                    f"-L{tmp_path}", "-lc10", "-ltorch_cpu"], check=True)
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": (tmp_path / "op.so").read_bytes()},
                       name="demo", tag=LINUX)
    assert platform_tag(wheel).manylinux


def test_the_analysis_never_changes_this_process_s_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI run found it: causal-conv1d's analysis made auditwheel's temporary directory
    the process's working directory while mamba-ssm's thread read its patches by the
    relative path recipes/../patches, and the build failed with "No such file"."""
    plain, _ = _compile(tmp_path)
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": plain}, name="demo", tag=LINUX)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "0001.patch").write_text("a patch\n")
    monkeypatch.chdir(tmp_path)
    moved: list[str] = []
    monkeypatch.setattr(os, "chdir", lambda path: moved.append(str(path)))
    done = threading.Event()
    read: list[bool] = []

    def reader() -> None:  # another build's thread, reading by a relative path meanwhile
        while not done.is_set():
            read.append(Path("patches/0001.patch").is_file())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        found = platform_tag(wheel)
    finally:
        done.set()
        thread.join()
    assert found.manylinux, found
    assert moved == [], moved
    assert read and all(read), f"{read.count(False)} of {len(read)} reads missed the file"


def test_the_child_imports_what_this_process_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child is given this process's import path: an interpreter that has neither
    wheelforge nor auditwheel of its own (the venv's base interpreter) still analyses."""
    base = getattr(sys, "_base_executable", sys.executable)
    assert base != sys.executable, "the tests run in a venv (make test's .venv)"
    alone = subprocess.run([base, "-c", "import auditwheel"], capture_output=True)
    assert alone.returncode != 0, "the base interpreter has auditwheel of its own"
    plain, _ = _compile(tmp_path)
    wheel = make_wheel(tmp_path / "w", {"demo/_C.so": plain}, name="demo", tag=LINUX)
    monkeypatch.setattr(sys, "executable", base)
    assert platform_tag(wheel).manylinux


def test_an_analysis_that_cannot_run_keeps_linux_x86_64_and_says_why(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not a zip")
    found = platform_tag(wheel)
    assert (found.tag, found.manylinux) == ("linux_x86_64", False)
    assert found.note.startswith("auditwheel could not analyse it: "), found.note


def test_a_pure_wheel_has_no_platform(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, {"demo/__init__.py": ""})
    assert platform_tag(wheel).tag == "any"


def test_the_host_compiler_is_read_for_the_build_key(tmp_path: Path) -> None:
    fake = tmp_path / "fake-g++"
    fake.write_text("#!/bin/sh\necho 'g++ (Fake 99.1) 99.1.0'\necho 'Copyright'\n")
    fake.chmod(0o755)
    assert host_compiler({"CXX": str(fake), "PATH": ""}) == "g++ (Fake 99.1) 99.1.0"
    assert host_compiler({"CXX": "no-such-compiler", "PATH": str(tmp_path)}) == ""
