"""Hostile and clumsy inputs (issue 16): every fixture is made here, by the test.

One section per class: YAML, recipe names, recipe environment, patches, archives,
built wheels.  Each case is a row of a table, so the number of trial cases per class is
the number of rows; every case must end in the documented error class (exit code), with
the offending key, member or path named, and never in a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli_inprocess import Ran, run_wheelforge
from conftest import REPO, write_recipe
from wheelforge.errors import ConfigError, RecipeError
from wheelforge.recipe.format import RecipeBook, refused_env

PURE = ("format: 1\nname: demo\nversion: '1.0'\n"
        "sources: [{sdist: {filename: demo-1.0.tar.gz, sha256: '" + "0" * 64 + "'}}]\n"
        "build: {kind: pure}\n")


def wf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def wf_here(*args: str, cwd: Path = REPO) -> Ran:
    """``wf`` in the test's process, for a test that checks only text and exit status."""
    return run_wheelforge(*args, cwd=cwd)


def assert_clean_failure(res: subprocess.CompletedProcess[str] | Ran, code: int,
                         *needles: str) -> None:
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------
# YAML: recipes and wheelforge.yaml share one loader

def _bomb() -> str:
    """The classic billion laughs: 9 levels of 9 aliases, ~387 million nodes expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


YAML_CASES = [
    # (id, file bytes, expected text in the error)
    ("duplicate-top-key", (PURE + "name: other\n").encode(),
     "line 6: duplicate key 'name' (first at line 2)"),
    ("duplicate-nested-key", PURE.replace("build: {kind: pure}", "build:\n  kind: pure\n"
                                          "  kind: extension").encode(),
     "line 7: duplicate key 'kind' (first at line 6)"),
    ("duplicate-in-flow-mapping", PURE.replace("{kind: pure}", "{kind: pure, kind: pure}")
     .encode(), "duplicate key 'kind' (first at line 5)"),
    ("alias-bomb", (PURE + "summary: x\n" + _bomb()).encode(), "anchor &a is not allowed"),
    ("plain-alias", (PURE + "homepage: *nowhere\n").encode(), "alias *nowhere is not allowed"),
    ("merge-key-alias", (PURE + "x: &base {k: 1}\ny: {<<: *base}\n").encode(),
     "anchor &base is not allowed"),
    ("deep-flow-nesting", (PURE + "summary: " + "[" * 50000 + "]" * 50000 + "\n").encode(),
     "nested more than 32 levels deep"),
    ("deep-block-nesting", (PURE + "".join("  " * i + f"k{i}:\n" for i in range(100)))
     .encode(), "nested more than 32 levels deep"),
    ("latin-1", PURE.encode() + "summary: caf\xe9\n".encode("latin-1"),
     "not UTF-8 (byte 0xe9)"),
    ("utf-16", PURE.encode("utf-16"), "byte offset 0: not UTF-8 (byte 0xff)"),
    ("python-tag", (PURE + "summary: !!python/object/apply:os.system [id]\n").encode(),
     "could not determine a constructor"),
    ("unhashable-key", (PURE + "? [a, b]\n: 1\n").encode(), "unhashable"),
    ("yes-and-true-keys", (PURE + "yes: 1\ntrue: 2\n").encode(),
     "line 7: duplicate key True (first at line 6)"),
    ("impossible-date", (PURE + "summary: 2024-02-31\n").encode(),
     "line 6, column 10: cannot read '2024-02-31' as timestamp: day is out of range"),
    ("huge-integer", (PURE + "summary: " + "9" * 5000 + "\n").encode(),
     "as int: Exceeds the limit (4300 digits)"),
    ("bad-explicit-float", (PURE + "summary: !!float abc\n").encode(),
     "cannot read 'abc' as float"),
    ("control-character", (PURE + "summary: a\x01b\n").encode(),
     "unacceptable character #x0001"),
    ("two-mebibytes", (PURE + "summary: '" + "x" * (2 << 20) + "'\n").encode(),
     "larger than the 1,048,576 bytes"),
]


@pytest.mark.parametrize("data, expected", [c[1:] for c in YAML_CASES],
                         ids=[c[0] for c in YAML_CASES])
def test_hostile_recipe_yaml(tmp_path: Path, data: bytes, expected: str) -> None:
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    (rdir / "demo.yaml").write_bytes(data)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert exc.value.what == f"recipe {rdir / 'demo.yaml'} is not valid YAML"
    assert str(rdir / "demo.yaml") in exc.value.why
    assert expected in exc.value.why


@pytest.mark.parametrize("data, expected", [c[1:] for c in YAML_CASES],
                         ids=[c[0] for c in YAML_CASES])
def test_hostile_project_file_yaml(tmp_path: Path, data: bytes, expected: str) -> None:
    from wheelforge.builder.config import load_project_file
    from wheelforge.recipe.matrix import load_matrix, retention_keep

    path = tmp_path / "wheelforge.yaml"
    path.write_bytes(data.replace(b"format: 1\n", b"defaults: {}\n", 1))
    for load in (load_project_file, load_matrix, retention_keep):
        with pytest.raises(ConfigError) as exc:
            load(path)  # type: ignore[operator]
        assert expected in exc.value.why, load
        assert str(path) in exc.value.why


def test_non_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    rdir = write_recipe(tmp_path, "demo", "")
    data = PURE.encode() + "summary: caf\xe9\n".encode("latin-1")
    (rdir / "demo.yaml").write_bytes(data)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert exc.value.why.endswith(f"demo.yaml: byte offset {data.index(0xe9)}: not UTF-8 (byte "
                                  "0xe9); save the file as UTF-8")


def test_yaml_errors_through_the_cli(tmp_path: Path) -> None:
    """The bomb and the duplicate key end as recipe and config errors, not tracebacks."""
    write_recipe(tmp_path, "demo", PURE + _bomb())
    assert_clean_failure(wf_here("show", "demo", "--recipes", str(tmp_path / "recipes")), 3,
                         "is not valid YAML", "anchor &a is not allowed")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {arch: '12.0', arch: '9.0'}\n")
    assert_clean_failure(wf_here("doctor", cwd=tmp_path), 2,
                         "duplicate key 'arch' (first at line 1)")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {}\n# \xff\n")
    assert_clean_failure(wf_here("doctor", cwd=tmp_path), 2, "wheelforge.yaml: byte offset 15")


def test_project_file_with_a_non_string_key(tmp_path: Path) -> None:
    """Found by a structured mutation run: `5: x` under defaults was a TypeError."""
    from wheelforge.builder.config import load_project_file

    path = tmp_path / "wheelforge.yaml"
    path.write_text("defaults: {arch: '12.0', 5: null}\n")
    with pytest.raises(ConfigError) as info:
        load_project_file(path)
    assert "defaults.5: unknown key" in (info.value.why or "")


def test_the_shipped_yaml_still_loads() -> None:
    from wheelforge.builder.config import load_project_file
    from wheelforge.recipe.matrix import load_matrix

    book = RecipeBook(REPO / "recipes", REPO / "patches")
    assert len(book.load_all()) == len(book.names()) >= 3
    assert load_project_file(REPO / "wheelforge.yaml")
    assert load_matrix(REPO / "wheelforge.yaml", book.names()).recipes


# ------------------------------------------------------------------------------------------
# names: a recipe name from the command line is never a path

NAME_CASES = ["/etc/passwd", "/some/dir/name", "../outside", "sub/demo", "./demo",
              "demo/", "", " demo", "demo\n", "-demo", "demo\x00", "~/demo"]


@pytest.mark.parametrize("name", NAME_CASES)
def test_a_name_is_not_a_path(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "some" / "dir"
    outside.mkdir(parents=True)
    (outside / "name.yaml").write_text(PURE.replace("demo", "name"))
    rdir = write_recipe(tmp_path / "book", "demo", PURE)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "book" / "patches").load(name)
    assert exc.value.what == f"{name!r} is not a project name"
    assert "never by a path" in exc.value.why


def test_show_refuses_a_path(tmp_path: Path) -> None:
    outside = tmp_path / "some" / "dir"
    outside.mkdir(parents=True)
    (outside / "name.yaml").write_text(PURE.replace("demo", "name"))
    res = wf_here("show", str(outside / "name"), "--recipes", str(REPO / "recipes"))
    assert_clean_failure(res, 3, f"'{outside / 'name'}' is not a project name")
    assert res.stdout == ""


def test_names_still_normalize(tmp_path: Path) -> None:
    rdir = write_recipe(tmp_path, "demo-x", PURE.replace("name: demo", "name: demo-x"))
    book = RecipeBook(rdir, tmp_path / "patches")
    assert book.load("Demo_X").name == "demo-x"
    assert book.load("demo.x").name == "demo-x"


# ------------------------------------------------------------------------------------------
# recipe environment: nothing that changes which code runs

ENV_REFUSED = ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONWARNINGS",
               "PYTHONSAFEPATH", "pythonpath", "VIRTUAL_ENV", "PIP_INDEX_URL",
               "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "UV_INDEX_URL", "LD_PRELOAD",
               "LD_LIBRARY_PATH", "LD_AUDIT", "Ld_Preload", "DYLD_INSERT_LIBRARIES",
               "JEMALLOC_PRELOAD", "GCONV_PATH", "OPENSSL_CONF", "PATH", "COMPILER_PATH",
               "GCC_EXEC_PREFIX", "BASH_ENV", "ENV", "PERL5OPT", "NODE_OPTIONS",
               "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL", "HOME", "CC", "CXX", "LDSHARED",
               "CUDAHOSTCXX", "PYTORCH_NVCC", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
               "CFLAGS", "LDFLAGS", "CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_CUDA_COMPILER",
               "CMAKE_TOOLCHAIN_FILE", "CCACHE_PREFIX", "CCACHE_DIR", "SCCACHE_BUCKET",
               "CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS",
               "WHEELFORGE_COMPILE_CACHE"]
ENV_ALLOWED = ["CAUSAL_CONV1D_FORCE_BUILD", "FLASH_ATTENTION_SKIP_CUDA_BUILD", "BUILD_TARGET",
               "FLA_FAST", "MY_PATHFINDER", "HOMEBREW_NO_AUTO_UPDATE", "ENVIRONMENT"]


@pytest.mark.parametrize("key", ENV_REFUSED)
def test_recipe_env_refused(tmp_path: Path, key: str) -> None:
    body = PURE.replace("build: {kind: pure}", f"build:\n  kind: pure\n  env: {{{key}: 'x'}}")
    rdir = write_recipe(tmp_path, "demo", body)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert f"build.env.{key}: may not be set by a recipe: " in exc.value.why
    assert refused_env(key) is not None


@pytest.mark.parametrize("key", ENV_ALLOWED)
def test_recipe_env_project_switches_allowed(tmp_path: Path, key: str) -> None:
    body = PURE.replace("build: {kind: pure}", f"build:\n  kind: pure\n  env: {{{key}: 'x'}}")
    rdir = write_recipe(tmp_path, "demo", body)
    assert RecipeBook(rdir, tmp_path / "patches").load("demo").build.env == ((key, "x"),)


@pytest.mark.integration
def test_recipe_env_every_bad_key_named_at_once(tmp_path: Path) -> None:
    body = PURE.replace("build: {kind: pure}", "build:\n  kind: pure\n  env: {PYTHONPATH: /x, "
                        "LD_PRELOAD: /y.so, OK_SWITCH: '1', PATH: /z}")
    write_recipe(tmp_path, "demo", body)
    res = wf("show", "demo", "--recipes", str(tmp_path / "recipes"))
    assert_clean_failure(res, 3, "has 3 problem(s)", "build.env.PYTHONPATH", "build.env.LD_PRELOAD",
                         "build.env.PATH")
    assert "OK_SWITCH" not in res.stderr


def test_recipe_env_table_is_documented() -> None:
    from wheelforge.recipe.format import REFUSED_ENV

    doc = (REPO / "docs" / "recipe-format.md").read_text()
    for patterns, _why in REFUSED_ENV:
        for pattern in patterns:
            assert f"`{pattern}`" in doc, pattern


# ------------------------------------------------------------------------------------------
# patches: checked before any is applied, and the tree checked after each

def _new_link(path: str, target: str) -> str:
    return (f"diff --git a/{path} b/{path}\nnew file mode 120000\nindex 0000000..1111111\n"
            f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+{target}\n"
            "\\ No newline at end of file\n")


def _new_file(header: str, body: str = "+x\n") -> str:
    return f"{header}@@ -0,0 +1 @@\n{body}"


PATCH_CASES = [
    # (id, patch text, what the error names)
    ("symlink-absolute", _new_link("leak", "/etc/passwd"), "mode 120000, a symlink, for 'leak'"),
    ("symlink-escaping", _new_link("leak", "../../../../etc/passwd"), "a symlink, for 'leak'"),
    ("symlink-in-tree", _new_link("alias.py", "setup.py"), "a symlink, for 'alias.py'"),
    ("symlink-into-subdir", _new_link("pkg/leak", "/root/.ssh/id_rsa"), "for 'pkg/leak'"),
    ("mode-change-to-symlink", "diff --git a/setup.py b/setup.py\nold mode 100644\n"
     "new mode 120000\n", "mode 120000, a symlink, for 'setup.py'"),
    ("retarget-existing-symlink", "diff --git a/link b/link\nindex 1111111..2222222 120000\n"
     "--- a/link\n+++ b/link\n@@ -1 +1 @@\n-setup.py\n\\ No newline at end of file\n"
     "+/etc/passwd\n\\ No newline at end of file\n", "mode 120000, a symlink, for 'link'"),
    ("delete-symlink", "diff --git a/link b/link\ndeleted file mode 120000\n"
     "index 1111111..0000000\n--- a/link\n+++ /dev/null\n@@ -1 +0,0 @@\n-setup.py\n",
     "mode 120000"),
    ("submodule", "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1111111\n"
     "--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit " + "1" * 40 + "\n",
     "mode 160000, a submodule (gitlink), for 'sub'"),
    ("setuid-mode", _new_file("diff --git a/x.sh b/x.sh\nnew file mode 104755\n"
                              "--- /dev/null\n+++ b/x.sh\n"), "mode 104755, a special file mode"),
    ("world-writable-mode", "diff --git a/setup.py b/setup.py\nold mode 100644\nnew mode 100777\n",
     "mode 100777, a special file mode"),
    ("absolute-traditional", "--- /tmp/x\n+++ /tmp/x\n@@ -1 +1 @@\n-a\n+b\n",
     "an absolute path '/tmp/x'"),
    ("absolute-new-file", _new_file("--- /dev/null\n+++ /tmp/wf-hostile-new\n"),
     "an absolute path '/tmp/wf-hostile-new'"),
    ("absolute-after-prefix", _new_file("--- /dev/null\n+++ b//tmp/x\n"),
     "an absolute path 'b//tmp/x'"),
    ("dotdot-traditional", "--- a/../setup.py\n+++ b/../setup.py\n@@ -1 +1 @@\n-line 1\n+x\n",
     "a path with a '..' component 'a/../setup.py'"),
    ("dotdot-git-header", _new_file("diff --git a/../../x b/../../x\nnew file mode 100644\n"
                                    "--- /dev/null\n+++ b/../../x\n"),
     "a path with a '..' component 'a/../../x'"),
    ("dotdot-quoted-octal", _new_file('--- /dev/null\n+++ "b/\\056\\056/x"\n'),
     "a path with a '..' component 'b/../x'"),
    ("rename-out", "diff --git a/setup.py b/setup.py\nsimilarity index 100%\n"
     "rename from setup.py\nrename to ../evil.py\n", "a path with a '..' component '../evil.py'"),
    ("copy-to-absolute", "diff --git a/setup.py b/setup.py\nsimilarity index 100%\n"
     "copy from setup.py\ncopy to /tmp/evil.py\n", "an absolute path '/tmp/evil.py'"),
    ("mode-after-two-blanks", "diff --git a/x b/x\nnew file mode \t 120000\n--- /dev/null\n"
     "+++ b/x\n@@ -0,0 +1 @@\n+/etc/passwd\n", "mode 120000, a symlink, for 'x'"),
    ("mode-with-leading-zero", "diff --git a/x b/x\nnew file mode 0120000\n",
     "mode 0120000, a special file mode"),
    ("index-line-odd-ids", "diff --git a/link b/link\nindex XYZ..ABC 120000\n", "mode 120000"),
    ("absolute-after-blanks", _new_file("--- /dev/null\n+++ \t/tmp/x\n"),
     "an absolute path '/tmp/x'"),
    ("hidden-by-form-feed", "--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,2 @@\n line 1\x0c"
     "\n-line 2\n+LINE 2\n" + _new_link("leak", "/etc/passwd"), "mode 120000, a symlink"),
    ("crlf-line-ends", _new_link("leak", "/etc/passwd").replace("\n", "\r\n"),
     "mode 120000, a symlink, for 'leak'"),
    ("after-a-good-hunk", "--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-line 1\n+LINE 1\n"
     + _new_link("leak", "/etc/shadow"), "line 7: mode 120000"),
]


@pytest.fixture
def src_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "work" / "proj"
    (tree / "pkg").mkdir(parents=True)
    (tree / "setup.py").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (tree / "link").symlink_to("setup.py")
    return tree


GOOD_PATCH = ("--- a/setup.py\n+++ b/setup.py\n@@ -1,3 +1,3 @@\n"
              " line 1\n-line 2\n+LINE 2\n line 3\n")


def _snapshot(root: Path) -> dict[str, str]:
    import os

    out = {}
    for parent, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(parent, n)
            out[str(p.relative_to(root))] = (f"-> {os.readlink(p)}" if p.is_symlink() else
                                             p.read_text() if p.is_file() else "dir")
    return out


@pytest.mark.parametrize("text, named", [c[1:] for c in PATCH_CASES],
                         ids=[c[0] for c in PATCH_CASES])
def test_hostile_patch_refused_before_anything_is_applied(src_tree: Path, tmp_path: Path,
                                                          text: str, named: str) -> None:
    from wheelforge.builder.source.patch import apply_series
    from wheelforge.errors import PatchError

    good = tmp_path / "0001-good.patch"
    good.write_text(GOOD_PATCH)
    bad = tmp_path / "0002-hostile.patch"
    bad.write_text(text)
    before = _snapshot(src_tree)
    with pytest.raises(PatchError) as exc:
        apply_series(src_tree, [good, bad], project="demo 1.0")
    assert exc.value.what.startswith("patch 0002-hostile.patch is refused (line ")
    assert named in exc.value.what + exc.value.why
    assert _snapshot(src_tree) == before  # not even 0001 was applied
    assert not src_tree.with_name("proj.patching").exists()
    assert not Path("/tmp/wf-hostile-new").exists() and not (tmp_path / "work" / "x").exists()


@pytest.mark.integration
def test_links_made_by_a_patch_are_caught_after_applying(src_tree: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The second line of defence: were the header checks fooled, the tree is checked after
    each patch (here the checks are switched off to show it)."""
    from wheelforge.builder.source import patch as patch_mod
    from wheelforge.errors import PatchError

    monkeypatch.setattr(patch_mod, "check_patch", lambda _p: None)
    for name, target in (("leak", "/etc/passwd"), ("leak2", "setup.py")):
        p = tmp_path / f"{name}.patch"
        p.write_text(_new_link(name, target))
        with pytest.raises(PatchError) as exc:
            patch_mod.apply_series(src_tree, [p], project="demo 1.0")
        assert exc.value.what == f"patch {name}.patch made {name} a symlink to {target} in demo 1.0"
        assert not (src_tree / name).is_symlink()


@pytest.mark.integration
def test_escaping_link_in_the_tree_is_caught(src_tree: Path, tmp_path: Path) -> None:
    from wheelforge.builder.source.patch import apply_series
    from wheelforge.errors import PatchError

    (src_tree / "pkg" / "out").symlink_to("../../..")
    p = tmp_path / "0001.patch"
    p.write_text(GOOD_PATCH)
    with pytest.raises(PatchError, match=r"after patch 0001.patch, pkg/out in demo resolves "
                                         r"outside the tree"):
        apply_series(src_tree, [p], project="demo")


BENIGN = """From 1234 Mon Sep 17 00:00:00 2001
Subject: [PATCH] a commit message that quotes --- /etc/passwd and a/../b

---
 setup.py | 4 ++--
 1 file changed, 2 insertions(+), 2 deletions(-)

diff --git a/setup.py b/setup.py
index 1111111..2222222 100644
--- a/setup.py
+++ b/setup.py
@@ -1,4 +1,4 @@
--- /etc/removed
+++ /abs/added
 line 2
--- a/../gone
+++ b/../new
 line 4
diff --git a/tool.sh b/tool.sh
new file mode 100755
--- /dev/null
+++ b/tool.sh
@@ -0,0 +1 @@
+echo hi
--
2.43.0
"""


def test_benign_patches_pass_the_checks() -> None:
    """Hunk lines that look like headers ('--- /x' removing '-- /x') are content, a commit
    message is not a header, and 100755 is a normal mode; the shipped series passes."""
    from wheelforge.builder.source.patch import refusals

    assert refusals(BENIGN) == []
    for p in sorted((REPO / "patches").rglob("*.patch")):
        assert refusals(p.read_text()) == [], p.name


# ------------------------------------------------------------------------------------------
# archives: bounded, one top-level directory, nothing outside, every failure a SourceError

def _tar(path: Path, members: list[tuple[str, str, bytes | str]], mode: str = "w:gz") -> Path:
    """(name, kind, data): kind f (file; data), d (dir), l (symlink; data = target),
    h (hard link; data = target), c/b/p (char/block device, FIFO), s (setuid file)."""
    import io
    import tarfile

    types = {"f": tarfile.REGTYPE, "s": tarfile.REGTYPE, "d": tarfile.DIRTYPE,
             "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE, "c": tarfile.CHRTYPE,
             "b": tarfile.BLKTYPE, "p": tarfile.FIFOTYPE}
    with tarfile.open(path, mode) as tf:
        for name, kind, data in members:
            ti = tarfile.TarInfo(name)
            ti.type = types[kind]
            ti.mode = 0o4777 if kind == "s" else 0o755 if kind == "d" else 0o644
            if kind in "lh":
                ti.linkname = str(data)
                tf.addfile(ti)
            elif kind in "fs":
                raw = data.encode() if isinstance(data, str) else data
                ti.size = len(raw)
                tf.addfile(ti, io.BytesIO(raw))
            else:
                tf.addfile(ti)
    return path


def _zip(path: Path, members: list[tuple[str, str, bytes | str]]) -> Path:
    """(name, kind, data): kind f (file), l (symlink by external attributes), p (FIFO)."""
    import stat
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, kind, data in members:
            zi = zipfile.ZipInfo(name)
            zi.external_attr = {"f": stat.S_IFREG | 0o644, "l": stat.S_IFLNK | 0o777,
                                "p": stat.S_IFIFO | 0o644}[kind] << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return path


OK = ("demo-1.0/setup.py", "f", "print('hi')\n")

ARCHIVE_CASES = [
    # (id, builder(path) -> archive, expected text in what + why)
    ("tar-absolute-member", lambda p: _tar(p, [OK, ("/etc/wf-evil", "f", "x")]),
     "member '/etc/wf-evil'"),
    ("tar-dotdot-member", lambda p: _tar(p, [OK, ("demo-1.0/../../wf-evil", "f", "x")]),
     "'..' component"),
    ("tar-two-top-level-dirs", lambda p: _tar(p, [OK, ("other-1.0/setup.py", "f", "x")]),
     "member 'other-1.0/setup.py'"),
    ("tar-file-at-top-level", lambda p: _tar(p, [("setup.py", "f", "x"), OK]),
     "a file at the top level"),
    ("tar-symlink-absolute", lambda p: _tar(p, [OK, ("demo-1.0/leak", "l", "/etc/passwd")]),
     "a link to '/etc/passwd'"),
    ("tar-symlink-escaping", lambda p: _tar(p, [OK, ("demo-1.0/leak", "l", "../../etc")]),
     "which leaves the tree"),
    ("tar-symlink-chain-escaping", lambda p: _tar(p, [
        OK, ("demo-1.0/a/b", "d", ""), ("demo-1.0/a/b/d", "l", "../.."),
        ("demo-1.0/lnk", "l", "a/b/d/../../..")]),
     "member 'demo-1.0/lnk'"),
    ("tar-write-through-symlink", lambda p: _tar(p, [
        OK, ("demo-1.0/sub", "d", ""), ("demo-1.0/l", "l", "sub"),
        ("demo-1.0/l/x.py", "f", "x")]), "written through the link demo-1.0/l"),
    ("tar-hardlink-absolute", lambda p: _tar(p, [OK, ("demo-1.0/h", "h", "/etc/passwd")]),
     "a hard link to '/etc/passwd'"),
    ("tar-hardlink-dotdot", lambda p: _tar(p, [OK, ("demo-1.0/h", "h", "../x")]),
     "a hard link to '../x'"),
    ("tar-hardlink-to-symlink", lambda p: _tar(p, [OK, ("demo-1.0/l", "l", "setup.py"),
                                                   ("demo-1.0/h", "h", "demo-1.0/l")]),
     "a hard link to 'demo-1.0/l'"),
    ("tar-hardlink-forward", lambda p: _tar(p, [OK, ("demo-1.0/h", "h", "demo-1.0/later"),
                                                ("demo-1.0/later", "f", "x")]),
     "not a file extracted before it"),
    ("tar-char-device", lambda p: _tar(p, [OK, ("demo-1.0/null", "c", "")]),
     "a character device"),
    ("tar-block-device", lambda p: _tar(p, [OK, ("demo-1.0/sda", "b", "")]), "a block device"),
    ("tar-fifo", lambda p: _tar(p, [OK, ("demo-1.0/fifo", "p", "")]), "a FIFO"),
    ("tar-duplicate-member", lambda p: _tar(p, [OK, OK]), "holds this name twice"),
    ("tar-backslash", lambda p: _tar(p, [OK, ("demo-1.0\\..\\..\\x", "f", "x")]),
     "backslash"),
    ("tar-empty", lambda p: _tar(p, []), "the archive is empty"),
    ("tar-xz-absolute", lambda p: _tar(p.with_suffix(".xz"), [OK, ("/x", "f", "x")], "w:xz"),
     "member '/x'"),
    ("tar-bz2-two-tops", lambda p: _tar(p.with_suffix(".bz2"), [OK, ("b/x", "f", "x")], "w:bz2"),
     "member 'b/x'"),
    ("zip-absolute-member", lambda p: _zip(p, [OK, ("/etc/wf-evil", "f", "x")]),
     "member '/etc/wf-evil'"),
    ("zip-dotdot-member", lambda p: _zip(p, [OK, ("demo-1.0/../../x", "f", "x")]),
     "'..' component"),
    ("zip-two-top-level-dirs", lambda p: _zip(p, [OK, ("b-1.0/x", "f", "x")]),
     "a second top-level directory"),
    ("zip-symlink-absolute", lambda p: _zip(p, [OK, ("demo-1.0/leak", "l", "/etc/passwd")]),
     "a link to '/etc/passwd'"),
    ("zip-symlink-escaping", lambda p: _zip(p, [OK, ("demo-1.0/leak", "l", "../../..")]),
     "which leaves the tree"),
    ("zip-fifo", lambda p: _zip(p, [OK, ("demo-1.0/fifo", "p", "")]), "a device, FIFO"),
    ("zip-duplicate", lambda p: _zip(p, [OK, OK]), "holds this name twice"),
    ("zip-backslash", lambda p: _zip(p, [OK, ("demo-1.0\\x", "f", "x")]), "backslash"),
]


def _truncate(p: Path, keep: float) -> Path:
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * keep)])
    return p


def _big_tar(p: Path, mode: str = "w:gz") -> Path:
    import os

    return _tar(p, [OK, *((f"demo-1.0/f{i}.bin", "f", os.urandom(20000)) for i in range(20))],
                mode)


def _corrupt(p: Path) -> Path:
    data = bytearray(p.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    return p


BROKEN_CASES = [
    ("truncated-tar-gz", lambda p: _truncate(_big_tar(p), 0.5), "cannot extract demo-1.0.tar.gz"
     " at member 'demo-1.0/f"),
    ("truncated-plain-tar", lambda p: _truncate(_big_tar(p, "w"), 0.5), "at member 'demo-1.0/f"),
    ("truncated-tar-xz", lambda p: _truncate(_big_tar(p, "w:xz"), 0.5), "at member 'demo-1.0/f"),
    ("truncated-zip", lambda p: _truncate(_zip(p, [OK, ("demo-1.0/b", "f", "y" * 99999)]), 0.5),
     "cannot extract demo-1.0.tar.gz"),
    ("corrupt-gzip-stream", lambda p: _corrupt(_big_tar(p)), "cannot extract demo-1.0.tar.gz"),
    ("not-an-archive", lambda p: (p.write_bytes(b"<html>404</html>"), p)[1],
     "cannot extract demo-1.0.tar.gz"),
    ("zero-bytes", lambda p: (p.write_bytes(b""), p)[1], "cannot extract demo-1.0.tar.gz"),
]


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("make, expected", [c[1:] for c in ARCHIVE_CASES + BROKEN_CASES],
                         ids=[c[0] for c in ARCHIVE_CASES + BROKEN_CASES])
def test_hostile_archive(tmp_path: Path, make: object, expected: str) -> None:
    from wheelforge.builder.source.fetch import extract
    from wheelforge.errors import SourceError

    archive = make(tmp_path / "demo-1.0.tar.gz")  # type: ignore[operator]
    out = tmp_path / "out"
    with pytest.raises(SourceError) as exc:
        extract(archive, out)
    assert expected in exc.value.what + " " + exc.value.why, exc.value.render()
    assert list(out.iterdir()) == []  # nothing left behind
    assert not (tmp_path / "wf-evil").exists() and not Path("/etc/wf-evil").exists()


@pytest.mark.parametrize("limits, members, expected", [
    ({"max_members": 10}, [OK, *((f"demo-1.0/f{i}", "f", "x") for i in range(10))],
     "more than 10 members (extract.max-members)"),
    ({"max_member_bytes": 1 << 20}, [OK, ("demo-1.0/big", "f", b"\0" * (3 << 20))],
     "member 'demo-1.0/big'"),
    ({"max_bytes": 5 << 20}, [OK, *((f"demo-1.0/f{i}", "f", b"\0" * (2 << 20)) for i in range(4))],
     "member 'demo-1.0/f2'"),
])
@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_archive_bounds(tmp_path: Path, fmt: str, limits: dict[str, int],
                        members: list[tuple[str, str, bytes | str]], expected: str) -> None:
    from wheelforge.builder.source.fetch import extract
    from wheelforge.errors import SourceError
    from wheelforge.recipe.model import ExtractLimits

    archive = (_tar if fmt == "tar" else _zip)(tmp_path / "demo-1.0.src", members)
    with pytest.raises(SourceError) as exc:
        extract(archive, tmp_path / "out", ExtractLimits(**limits))
    assert expected in exc.value.what + " " + exc.value.why
    assert "raise extract." in exc.value.fix
    assert list((tmp_path / "out").iterdir()) == []


def test_archive_bound_counts_bytes_written_not_declared(tmp_path: Path) -> None:
    """A zip whose directory declares 1 KiB for a 3 MiB member: the bytes written count."""
    import struct

    from wheelforge.builder.source.fetch import extract
    from wheelforge.errors import SourceError
    from wheelforge.recipe.model import ExtractLimits

    archive = _zip(tmp_path / "demo-1.0.zip", [OK, ("demo-1.0/big", "f", b"\0" * (3 << 20))])
    data = bytearray(archive.read_bytes())
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local and central header
        at = data.rfind(sig)
        data[at + offset:at + offset + 4] = struct.pack("<I", 1024)
    archive.write_bytes(bytes(data))
    with pytest.raises(SourceError):
        extract(archive, tmp_path / "out", ExtractLimits(max_member_bytes=1 << 20))
    assert list((tmp_path / "out").iterdir()) == []


def test_default_member_bound_refuses_before_extracting(tmp_path: Path) -> None:
    """100,001 members (the issue's 100,000 were extracted and built) with the defaults."""
    import zipfile

    from wheelforge.builder.source.fetch import extract
    from wheelforge.errors import SourceError

    archive = tmp_path / "demo-1.0.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for i in range(100_001):
            zf.writestr(f"demo-1.0/f{i}", b"")
    with pytest.raises(SourceError) as exc:
        extract(archive, tmp_path / "out")
    assert exc.value.what == "demo-1.0.zip: refused member 'demo-1.0/f100000'"
    assert "more than 100,000 members" in exc.value.why
    assert list((tmp_path / "out").iterdir()) == []


def test_benign_archives_extract(tmp_path: Path) -> None:
    """In-tree links, hard links (copied), './' prefixes, setuid bits dropped, xz and zip."""
    import os
    import stat

    from wheelforge.builder.source.fetch import extract

    members = [("./demo-1.0/", "d", ""), ("./demo-1.0/setup.py", "f", "x = 1\n"),
               ("demo-1.0/pkg/mod.py", "f", "y = 2\n"), ("demo-1.0/pkg/alias.py", "l", "mod.py"),
               ("demo-1.0/up.py", "l", "pkg/../setup.py"), ("demo-1.0/hard.py", "h",
                                                            "demo-1.0/setup.py"),
               ("demo-1.0/tool.sh", "s", "echo\n")]
    for mode, suffix in (("w:gz", "tar.gz"), ("w:xz", "tar.xz"), ("w", "tar")):
        root = extract(_tar(tmp_path / f"demo-1.0.{suffix}", members, mode), tmp_path / suffix)
        assert root == tmp_path / suffix / "demo-1.0"
        assert (root / "pkg" / "alias.py").read_text() == "y = 2\n"
        assert os.readlink(root / "pkg" / "alias.py") == "mod.py"
        assert (root / "hard.py").read_text() == "x = 1\n"
        assert not (root / "hard.py").is_symlink()
        assert stat.S_IMODE((root / "tool.sh").stat().st_mode) == 0o755
    root = extract(_zip(tmp_path / "demo-1.0.zip", [OK, ("demo-1.0/l", "l", "setup.py")]),
                   tmp_path / "zip")
    assert os.readlink(root / "l") == "setup.py"


@pytest.mark.parametrize("body, expected", [
    ("extract: {max-bytes: 4GiB, max-members: 200000, max-member-bytes: 1073741824}",
     (4 << 30, 200_000, 1 << 30)),
    ("extract: {max-bytes: '512 MiB'}", (512 << 20, 100_000, 512 << 20)),
    ("extract: {}", (2 << 30, 100_000, 512 << 20)),
])
def test_recipe_raises_the_bounds(tmp_path: Path, body: str, expected: tuple[int, ...]) -> None:
    rdir = write_recipe(tmp_path, "demo", PURE + body + "\n")
    lim = RecipeBook(rdir, tmp_path / "patches").load("demo").extract
    assert (lim.max_bytes, lim.max_members, lim.max_member_bytes) == expected


def test_show_prints_the_bounds(tmp_path: Path) -> None:
    write_recipe(tmp_path, "demo", PURE + "extract: {max-bytes: 4GiB, max-members: 200000}\n")
    res = wf_here("show", "demo", "--recipes", str(tmp_path / "recipes"))
    assert "extract:   at most 4,294,967,296 bytes, 200,000 members, 536,870,912 bytes a " \
        "member" in res.stdout


@pytest.mark.parametrize("body, named", [
    ("extract: {max-bytes: -1}", "extract.max-bytes: must be a positive integer"),
    ("extract: {max-bytes: 2 GB}", "extract.max-bytes: must be a positive integer"),
    ("extract: {max-members: 10MiB}", "extract.max-members: must be a positive integer, got"),
    ("extract: {max-member-bytes: true}", "extract.max-member-bytes: must be a positive"),
    ("extract: {max-byte: 1}", "extract.max-byte: unknown key; did you mean 'max-bytes'?"),
    ("extract: 5", "extract: must be a mapping"),
    ("extract: {max-bytes: '" + "9" * 5000 + "GiB'}", "extract.max-bytes: must be a positive"),
])
def test_bad_bounds_are_recipe_errors(tmp_path: Path, body: str, named: str) -> None:
    rdir = write_recipe(tmp_path, "demo", PURE + body + "\n")
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "patches").load("demo")
    assert named in exc.value.why


BUILD_CASES = [
    # (id, sdist members or None for a truncated one, patch text or None, exit code, stderr)
    ("sdist-absolute-member", [OK, ("/etc/wf-evil", "f", "x")], None, 4,
     "source error: demo-1.0.tar.gz: refused member '/etc/wf-evil'"),
    ("sdist-two-top-level-dirs", [OK, ("other/setup.py", "f", "x")], None, 4,
     "source error: demo-1.0.tar.gz: refused member 'other/setup.py'"),
    ("sdist-truncated", None, None, 4, "source error: cannot extract demo-1.0.tar.gz at member"),
    ("patch-symlink-out", [OK], _new_link("leak", "/etc/passwd"), 5,
     "patch error: patch 0001-leak.patch is refused (line 2: mode 120000, a symlink, for "
     "'leak')"),
    ("patch-absolute-path", [OK], "--- /tmp/x\n+++ /tmp/x\n@@ -1 +1 @@\n-a\n+b\n", 5,
     "patch error: patch 0001-leak.patch is refused (line 1: an absolute path '/tmp/x')"),
]


@pytest.mark.integration
@pytest.mark.parametrize("members, patch, code, expected", [c[1:] for c in BUILD_CASES],
                         ids=[c[0] for c in BUILD_CASES])
def test_hostile_build_inputs_end_as_errors(tmp_path: Path, members: list[tuple[str, str, str]]
                                            | None, patch: str | None, code: int,
                                            expected: str) -> None:
    """Through `wheelforge build`: before this issue these ended in a pypa/build traceback
    (exit 70), 'interrupted (SIGINT)' (exit 130), or a wheel holding /etc/passwd."""
    import hashlib

    sdists = tmp_path / "sdists"
    sdists.mkdir()
    archive = (_truncate(_big_tar(sdists / "demo-1.0.tar.gz"), 0.5) if members is None
               else _tar(sdists / "demo-1.0.tar.gz", members))
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    body = PURE.replace("0" * 64, sha) + ("patches: [0001-leak.patch]\n" if patch else "")
    write_recipe(tmp_path, "demo", body, {"0001-leak.patch": patch} if patch else None)
    res = wf("build", "demo", "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
             "--cache-dir", str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"),
             "--index", str(tmp_path / "index"), cwd=tmp_path)
    assert_clean_failure(res, code, expected)
    assert "interrupted" not in res.stderr
    assert not (tmp_path / "index" / "files").exists() or \
        not list((tmp_path / "index" / "files").iterdir())


# ------------------------------------------------------------------------------------------
# built wheels: malformed or unsafe members are verify errors (exit 8) naming the member

def _wheel(tmp: Path, extra: list[tuple[str, bytes, int]], *, fname: str =
           "demo-1.0-py3-none-any.whl", dist: str = "demo-1.0.dist-info",
           skip: tuple[str, ...] = (), record: bytes | None = None,
           metadata: bytes = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n\n") -> Path:
    """A wheel with ``extra`` members (name, data, unix mode incl. file type; 0: plain) and
    a RECORD that lists them all correctly, so only what the case breaks is broken."""
    import stat
    import zipfile

    from wheelforge.wheel import record_hash

    files = [("demo/__init__.py", b"", 0), *extra,
             (f"{dist}/METADATA", metadata, 0),
             (f"{dist}/WHEEL", b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
              0)]
    files = [f for f in files if f[0].rsplit("/", 1)[-1] not in skip]
    rows = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d, _ in files)
    rows += f"{dist}/RECORD,,\n"
    path = tmp / fname
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, mode in [*files, (f"{dist}/RECORD", record if record is not None
                                          else rows.encode(), 0)]:
            if "RECORD" in skip and name.endswith("/RECORD"):
                continue
            zi = zipfile.ZipInfo(name)
            zi.external_attr = (mode or stat.S_IFREG | 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return path


def _raw(tmp: Path, name: str, data: bytes) -> Path:
    (tmp / name).write_bytes(data)
    return tmp / name


def _patched(path: Path, old: bytes, new: bytes) -> Path:
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new))
    return path


def _dup(tmp: Path) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _wheel(tmp, [("demo/x.py", b"1", 0), ("demo/x.py", b"2", 0)])


LNK, FIFO = 0o120777, 0o010644
WHEEL_CASES = [
    # (id, builder(tmp) -> wheel, text the error names, also refused by relabel and inspect)
    ("dotdot-member", lambda t: _wheel(t, [("../x.pth", b"import os", 0)]),
     "'../x.pth': a '..' component", True),
    ("dotdot-inside", lambda t: _wheel(t, [("demo/../../x.py", b"", 0)]),
     "'demo/../../x.py': a '..' component", True),
    ("absolute-member", lambda t: _wheel(t, [("/abs/x.py", b"", 0)]),
     "'/abs/x.py': an absolute path", True),
    ("drive-letter", lambda t: _wheel(t, [("C:/x.py", b"", 0)]), "'C:/x.py': an absolute path",
     True),
    ("backslash", lambda t: _wheel(t, [("demo\\..\\..\\x.py", b"", 0)]), "a backslash", True),
    ("empty-component", lambda t: _wheel(t, [("demo//x.py", b"", 0)]),
     "an empty or '.' path component", True),
    ("control-character", lambda t: _wheel(t, [("demo/x\n.py", b"", 0)]),
     "a control character", True),
    ("duplicate-name", _dup, "'demo/x.py': the wheel holds this name twice", True),
    ("symlink-member", lambda t: _wheel(t, [("demo/leak", b"/etc/passwd", LNK)]),
     "'demo/leak': a symlink", True),
    ("fifo-member", lambda t: _wheel(t, [("demo/fifo", b"", FIFO)]), "'demo/fifo': a special file",
     True),
    ("two-dist-infos", lambda t: _wheel(t, [("other-1.0.dist-info/METADATA", b"", 0)]),
     "2 .dist-info directories (demo-1.0.dist-info, other-1.0.dist-info)", True),
    ("no-dist-info", lambda t: _wheel(t, [], dist="demo-1.0.info", skip=()),
     "0 .dist-info directories (none)", True),
    ("dist-info-of-another-project", lambda t: _wheel(t, [], dist="evil-1.0.dist-info"),
     "'evil-1.0.dist-info': does not match the file name's demo 1.0", True),
    ("no-metadata", lambda t: _wheel(t, [], skip=("METADATA",)),
     "demo-1.0.dist-info/METADATA is missing", True),
    ("no-record", lambda t: _wheel(t, [], skip=("RECORD",)),
     "demo-1.0.dist-info/RECORD is missing", True),
    ("not-a-zip", lambda t: _raw(t, "demo-1.0-py3-none-any.whl", b"<html>404</html>"),
     "cannot read demo-1.0-py3-none-any.whl", True),
    ("truncated-zip", lambda t: _raw(t, "demo-1.0-py3-none-any.whl",
                                     _wheel(t, []).read_bytes()[:300]),
     "cannot read demo-1.0-py3-none-any.whl", True),
    ("bad-file-name", lambda t: _wheel(t, [], fname="demo.whl"),
     "demo.whl is not a valid wheel file name", True),
    ("bad-file-name-version", lambda t: _wheel(t, [], fname="demo-1.0-py3-none.whl"),
     "is not a valid wheel file name", True),
    ("record-not-utf8", lambda t: _wheel(t, [], record=b"demo/__init__.py,\xff\xfe,0\n"),
     "RECORD is not a UTF-8 CSV file", False),
    ("record-size-not-a-number", lambda t: _wheel(t, [], record=(
        b"demo/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,abc\n")),
     "size in RECORD (abc) is not 0", False),
    ("metadata-not-utf8", lambda t: _wheel(t, [], metadata=b"Name: d\xe9mo\nVersion: 1.0\n"),
     "demo-1.0.dist-info/METADATA is not UTF-8", True),
]


def _unknown_compression(t: Path) -> Path:
    """A member whose compression method is 99 (AES, unsupported) in both headers."""
    import struct

    path = _wheel(t, [("demo/z.py", b"x = 1\n" * 50, 0)])
    data = bytearray(path.read_bytes())
    name = b"demo/z.py"
    for sig, method_at, name_at in ((b"PK\x03\x04", 8, 30), (b"PK\x01\x02", 10, 46)):
        at = 0
        while (at := data.find(sig, at)) != -1:
            if data[at + name_at:at + name_at + len(name)] == name:
                data[at + method_at:at + method_at + 2] = struct.pack("<H", 99)
            at += 4
    path.write_bytes(bytes(data))
    return path


def _bad_crc(t: Path) -> Path:
    """Flip a byte of a stored member's data: the CRC check fails when it is read."""
    import zipfile

    path = t / "demo-1.0-py3-none-any.whl"
    good = _wheel(t, [("demo/data.txt", b"A" * 4000, 0)])
    with zipfile.ZipFile(good) as zin:
        items = [(zi, zin.read(zi)) for zi in zin.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zout:
        for zi, data in items:
            zi.compress_type = zipfile.ZIP_STORED
            zout.writestr(zi, data)
    return _patched(path, b"A" * 4000, b"A" * 1999 + b"B" + b"A" * 2000)


WHEEL_CASES += [
    ("unknown-compression", _unknown_compression, "cannot read demo-1.0-py3-none-any.whl", False),
    ("bad-crc", _bad_crc, "cannot read demo-1.0-py3-none-any.whl", False),
]


def _pure_recipe(tmp: Path) -> object:
    rdir = write_recipe(tmp, "demo", PURE)
    return RecipeBook(rdir, tmp / "patches").load("demo")


@pytest.mark.parametrize("make, named, everywhere", [c[1:] for c in WHEEL_CASES],
                         ids=[c[0] for c in WHEEL_CASES])
def test_hostile_wheel_fails_verification(tmp_path: Path, make: object, named: str,
                                          everywhere: bool) -> None:
    from wheelforge.builder.artifact.verify import verify_wheel
    from wheelforge.errors import VerifyError
    from wheelforge.wheel import relabel

    (tmp_path / "w").mkdir()
    wheel = make(tmp_path / "w")  # type: ignore[operator]
    recipe = _pure_recipe(tmp_path)
    with pytest.raises(VerifyError) as exc:
        verify_wheel(wheel, recipe, archs=(), env=None)  # type: ignore[arg-type]
    assert named in exc.value.what + exc.value.why, exc.value.render()
    assert exc.value.exit_code == 8
    if everywhere:  # what relabel reads (before verify, in the pipeline) is checked there too
        with pytest.raises(VerifyError) as exc2:
            relabel(wheel, tmp_path / "out", local="x", torch_pin=None)
        assert named in exc2.value.what + exc2.value.why
        assert not list(tmp_path.glob("out/*.whl"))


@pytest.mark.parametrize("make, named", [c[1:3] for c in WHEEL_CASES if c[3]],
                         ids=[c[0] for c in WHEEL_CASES if c[3]])
def test_hostile_wheel_inspect_command(tmp_path: Path, make: object, named: str) -> None:
    wheel = make(tmp_path)  # type: ignore[operator]
    assert_clean_failure(wf_here("inspect", str(wheel)), 8, named)


@pytest.mark.integration
def test_recipe_pythonpath_never_reaches_the_build(tmp_path: Path) -> None:
    """The issue's case: a sitecustomize.py in a recipe's PYTHONPATH ran inside the build."""
    hook = tmp_path / "hook"
    hook.mkdir()
    marker = tmp_path / "ran"
    (hook / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    sdists = tmp_path / "sdists"
    sdists.mkdir()
    import hashlib

    sha = hashlib.sha256(_tar(sdists / "demo-1.0.tar.gz", [OK]).read_bytes()).hexdigest()
    body = PURE.replace("0" * 64, sha).replace(
        "build: {kind: pure}", f"build:\n  kind: pure\n  env: {{PYTHONPATH: '{hook}'}}")
    write_recipe(tmp_path, "demo", body)
    res = wf("build", "demo", "--recipes", str(tmp_path / "recipes"), "--sources", str(sdists),
             "--cache-dir", str(tmp_path / "cache"), "--work-dir", str(tmp_path / "work"),
             "--index", str(tmp_path / "index"), cwd=tmp_path)
    assert_clean_failure(res, 3, "build.env.PYTHONPATH: may not be set by a recipe")
    assert not marker.exists()


@pytest.mark.parametrize("member", ["../x.pth", "/abs/x.py", "demo\\x.py"])
def test_the_index_refuses_unsafe_wheels_too(tmp_path: Path, member: str) -> None:
    """Defence in depth: a wheel handed to publish (or dropped into files/) directly."""
    from wheelforge import index
    from wheelforge.errors import PublishError

    (tmp_path / "w").mkdir()
    wheel = _wheel(tmp_path / "w", [(member, b"", 0)])
    with pytest.raises(PublishError) as exc:
        index.publish(tmp_path / "index", wheel, channel=None, cuda=None, torch=None, archs=(),
                      build_key=None)
    assert repr(member) in exc.value.why
    assert not list(tmp_path.glob("index/files/*.whl"))


# ------------------------------------------------------------------------------------------
# mutation runs: byte-level damage to a valid input ends in the class's own error, always

def _mutate(rnd: object, data: bytes) -> bytes:
    import random

    assert isinstance(rnd, random.Random)
    b = bytearray(data)
    for _ in range(rnd.randint(1, 8)):
        op, i = rnd.random(), rnd.randrange(len(b) + 1)
        if op < 0.4 and b:
            b[min(i, len(b) - 1)] = rnd.randrange(256)
        elif op < 0.6:
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif op < 0.8:
            del b[i:i + rnd.randint(1, 16)]
        else:
            del b[i:]
    return bytes(b)


MUTATIONS = 100  # per input, fixed seeds; many more were run by hand for issue 16


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("kind", ["recipe", "tar.gz", "tar", "zip", "wheel", "patch"])
def test_mutated_inputs_fail_cleanly(tmp_path: Path, kind: str) -> None:
    import contextlib
    import random
    import shutil

    from conftest import make_wheel
    from wheelforge.builder.artifact.verify import verify_wheel
    from wheelforge.builder.source.fetch import extract
    from wheelforge.builder.source.patch import check_patch
    from wheelforge.errors import PatchError, SourceError, VerifyError
    from wheelforge.wheel import relabel

    rnd = random.Random(f"issue16-{kind}")
    members = [OK, ("demo-1.0/p/m.py", "f", "y = 2\n" * 60), ("demo-1.0/l", "l", "setup.py")]
    recipe = _pure_recipe(tmp_path / "book")
    if kind == "recipe":
        seed = (REPO / "recipes" / "causal-conv1d.yaml").read_bytes()
    elif kind == "wheel":
        seed = make_wheel(tmp_path / "seed", {"demo/__init__.py": "x = 1\n" * 40}).read_bytes()
    elif kind == "patch":
        seed = (REPO / "patches" / "causal-conv1d" / "0001-find-nvcc.patch").read_bytes()
    else:
        maker = _zip if kind == "zip" else _tar
        args = () if kind == "zip" else ("w:gz" if kind == "tar.gz" else "w",)
        seed = maker(tmp_path / "seed.bin", members if kind != "zip" else members[:2],
                     *args).read_bytes()  # type: ignore[operator]
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    for _ in range(MUTATIONS):
        data = _mutate(rnd, seed)
        if kind == "recipe":
            (rdir / "causal-conv1d.yaml").write_bytes(data)
            # a mutation that leaves the recipe valid (a changed comment) is fine
            with contextlib.suppress(RecipeError):
                RecipeBook(rdir, REPO / "patches").load("causal-conv1d")
        elif kind == "wheel":
            wheel = tmp_path / "demo-1.0-py3-none-any.whl"
            wheel.write_bytes(data)
            with contextlib.suppress(VerifyError):
                verify_wheel(wheel, recipe, archs=(), env=None)  # type: ignore[arg-type]
            with contextlib.suppress(VerifyError):
                relabel(wheel, tmp_path / "rl", local="x", torch_pin=None)
        elif kind == "patch":
            (tmp_path / "0001.patch").write_bytes(data)
            with contextlib.suppress(PatchError):
                check_patch(tmp_path / "0001.patch")
        else:
            archive = tmp_path / f"demo-1.0.{kind}"
            archive.write_bytes(data)
            out = tmp_path / "out"
            shutil.rmtree(out, ignore_errors=True)
            try:
                extract(archive, out)
            except SourceError:
                assert list(out.iterdir()) == []
            else:
                base = str(out.resolve())
                for p in out.rglob("*"):
                    assert str(p.resolve()).startswith(base), p


def test_structured_archives_stay_inside(tmp_path: Path) -> None:
    """Random tars of hostile names, types, modes and link targets (fixed seed): each is
    refused with nothing left, or extracts to regular files, directories and links that
    all resolve inside, with no setuid or group/world-writable mode."""
    import os
    import random
    import shutil
    import stat

    from wheelforge.builder.source.fetch import extract
    from wheelforge.errors import SourceError

    rnd = random.Random("issue16-structured-tar")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    comps = ["a", "b", "l", "c", ".", "..", "", "x\\\\y"]
    targets = ["..", "a", "l", "b", ".", "demo-1.0", str(outside)]
    counts = {"refused": 0, "extracted": 0}
    for _ in range(400):
        members = []
        for _ in range(rnd.randint(1, 8)):
            kind = rnd.choice("ffffddllhcps")
            name = "demo-1.0/" + "/".join(rnd.choice(comps) for _ in range(rnd.randint(1, 4)))
            data = (rnd.choice(["/", "", "../"]) + "/".join(
                rnd.choice(targets) for _ in range(rnd.randint(1, 4)))) if kind in "lh" else "x"
            members.append((name if rnd.random() < .9 else name[9:], kind, data))
        archive = _tar(tmp_path / "t.tar", members, "w")
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        try:
            extract(archive, out)
        except SourceError:
            counts["refused"] += 1
            assert list(out.iterdir()) == []
            continue
        counts["extracted"] += 1
        base = os.path.realpath(out)
        for parent, dirs, files in os.walk(out):
            for n in dirs + files:
                p = os.path.join(parent, n)
                st = os.lstat(p)
                assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or \
                    stat.S_ISLNK(st.st_mode), p
                assert stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o7022, (p, oct(st.st_mode))
                assert os.path.realpath(p).startswith(base + os.sep), p
    assert sorted(os.listdir(outside)) == ["secret"]
    assert counts["refused"] and counts["extracted"], counts


@pytest.mark.integration
def test_structured_patches_with_real_git(tmp_path: Path) -> None:
    """Random patches of symlink, mode, rename and path headers (fixed seed), applied for
    real: each is refused, or leaves no new symlink and nothing written outside."""
    import os
    import random
    import shutil

    from wheelforge.builder.source.patch import apply_series
    from wheelforge.errors import PatchError

    rnd = random.Random("issue16-structured-patch")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "s").write_text("line 1\n")

    def section() -> str:
        p = rnd.choice(["a/", "", "/", "a//", '"a/\\056\\056/']) + rnd.choice(
            ["x", "setup.py", "../outside/s", str(outside / "s")[1:], "link", "d/y"])
        q = p + '"' if p.startswith('"') else p
        b = q.replace("a/", "b/", 1)
        mode = rnd.choice(["100644", "100755", "120000", "160000", "100777", " 120000"])
        head = f"diff --git {q} {b}\n" if rnd.random() < .7 else ""
        roll = rnd.random()
        if roll < .3:
            return head + (f"new file mode {mode}\n--- /dev/null\n+++ {b}\n@@ -0,0 +1 @@\n+"
                           f"{rnd.choice(['/etc/passwd', '../outside/s', 'hi'])}\n")
        if roll < .5:
            return head + f"old mode 100644\nnew mode {mode}\n"
        if roll < .7:
            return head + f"--- {q}\n+++ {b}\n@@ -1 +1 @@\n-line 1\n+LINE 1\n"
        return head + (f"similarity index 100%\nrename from {rnd.choice(['setup.py', 'x'])}\n"
                       f"rename to {rnd.choice(['y', '../z', '/tmp/wf-z', 'd/q'])}\n")

    counts = {"refused": 0, "applied": 0}
    for _ in range(60):
        work = tmp_path / "w"
        shutil.rmtree(work, ignore_errors=True)
        tree = work / "proj"
        (tree / "d").mkdir(parents=True)
        for f in ("setup.py", "x"):
            (tree / f).write_text("line 1\n")
        (tree / "link").symlink_to("setup.py")
        patch = tmp_path / "p.patch"
        patch.write_text("".join(section() for _ in range(rnd.randint(1, 3))))
        try:
            apply_series(tree, [patch], project="demo")
            counts["applied"] += 1
        except PatchError:
            counts["refused"] += 1
        links = {os.path.relpath(os.path.join(dp, n), tree) for dp, dn, fn in os.walk(tree)
                 for n in dn + fn if os.path.islink(os.path.join(dp, n))}
        assert links <= {"link"}, (links, patch.read_text())
        assert (outside / "s").read_text() == "line 1\n" and os.listdir(outside) == ["s"]
        assert not Path("/tmp/wf-z").exists() and os.listdir(work) == ["proj"]
    assert counts["refused"] and counts["applied"], counts


def test_structured_recipes_and_project_files(tmp_path: Path) -> None:
    """Valid documents with random values swapped for junk (fixed seed): only recipe and
    config errors, never another exception."""
    import contextlib
    import random

    import yaml

    from wheelforge.builder.config import load_project_file, resolve
    from wheelforge.recipe.matrix import load_matrix

    rnd = random.Random("issue16-structured-yaml")
    junk: list[object] = [None, 0, -1, 1.5, True, "", "x", "../x", "/abs", [], [None], {},
                          {"a": 1}, [[[]]], "9" * 30, 10**30, "2GiB", {"sdist": None}]

    def corrupt(v: object, depth: int = 0) -> object:
        if rnd.random() < 0.25 or depth > 4:
            return rnd.choice(junk)
        if isinstance(v, dict):
            out = dict(v)
            if out:
                k = rnd.choice(list(out))
                out[k] = corrupt(out[k], depth + 1)
            if rnd.random() < 0.1:
                out[rnd.choice(["extra", "extract", "env", 5])] = rnd.choice(junk)
            return out
        if isinstance(v, list) and v:
            i = rnd.randrange(len(v))
            return [*v[:i], corrupt(v[i], depth + 1), *v[i + 1:]]
        return rnd.choice(junk)

    recipe = yaml.safe_load((REPO / "recipes" / "causal-conv1d.yaml").read_text())
    project = yaml.safe_load((REPO / "wheelforge.yaml").read_text())
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    for _ in range(300):
        (rdir / "causal-conv1d.yaml").write_text(yaml.safe_dump(corrupt(recipe)))
        with contextlib.suppress(RecipeError):
            RecipeBook(rdir, REPO / "patches").load("causal-conv1d")
        path = tmp_path / "wheelforge.yaml"
        path.write_text(yaml.safe_dump(corrupt(project)))
        with contextlib.suppress(ConfigError):
            load_project_file(path)
            load_matrix(path, ["causal-conv1d", "fla-core"])
            resolve(project_file=path)


def test_an_eof_error_is_not_reported_as_ctrl_c(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Why a truncated sdist said 'interrupted (SIGINT)': click turns an EOFError into
    Abort, as it does KeyboardInterrupt.  Any EOFError that still escapes is now a bug
    report (exit 70, traceback), never exit 130."""
    import signal

    from wheelforge.cli import main as cli

    @cli.cli.command("wf-test-eof")
    def boom() -> None:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGALRM)}
    monkeypatch.setattr(sys, "argv", ["wheelforge", "wf-test-eof"])
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        cli.cli.commands.pop("wf-test-eof")
        for s, handler in saved.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err
    assert exc.value.code == 70
    assert "interrupted" not in err and "EOFError: Compressed file ended" in err
