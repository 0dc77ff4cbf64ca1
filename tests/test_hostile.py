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

from conftest import REPO, write_recipe
from wheelforge.errors import ConfigError, RecipeError
from wheelforge.recipe import RecipeBook, refused_env

PURE = ("format: 1\nname: demo\nversion: '1.0'\n"
        "sources: [{sdist: {filename: demo-1.0.tar.gz, sha256: '" + "0" * 64 + "'}}]\n"
        "build: {kind: pure}\n")


def wf(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def assert_clean_failure(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
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
    from wheelforge.config import load_project_file
    from wheelforge.matrix import load_matrix, retention_keep

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
    assert_clean_failure(wf("show", "demo", "--recipes", str(tmp_path / "recipes")), 3,
                         "is not valid YAML", "anchor &a is not allowed")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {arch: '12.0', arch: '9.0'}\n")
    assert_clean_failure(wf("doctor", cwd=tmp_path), 2, "duplicate key 'arch' (first at line 1)")
    (tmp_path / "wheelforge.yaml").write_bytes(b"defaults: {}\n# \xff\n")
    assert_clean_failure(wf("doctor", cwd=tmp_path), 2, "wheelforge.yaml: byte offset 15")


def test_the_shipped_yaml_still_loads() -> None:
    from wheelforge.config import load_project_file
    from wheelforge.matrix import load_matrix

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
    res = wf("show", str(outside / "name"), "--recipes", str(REPO / "recipes"))
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


def test_recipe_env_every_bad_key_named_at_once(tmp_path: Path) -> None:
    body = PURE.replace("build: {kind: pure}", "build:\n  kind: pure\n  env: {PYTHONPATH: /x, "
                        "LD_PRELOAD: /y.so, OK_SWITCH: '1', PATH: /z}")
    write_recipe(tmp_path, "demo", body)
    res = wf("show", "demo", "--recipes", str(tmp_path / "recipes"))
    assert_clean_failure(res, 3, "has 3 problem(s)", "build.env.PYTHONPATH", "build.env.LD_PRELOAD",
                         "build.env.PATH")
    assert "OK_SWITCH" not in res.stderr


def test_recipe_env_table_is_documented() -> None:
    from wheelforge.recipe import REFUSED_ENV

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
    from wheelforge.errors import PatchError
    from wheelforge.patch import apply_series

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


def test_links_made_by_a_patch_are_caught_after_applying(src_tree: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The second line of defence: were the header checks fooled, the tree is checked after
    each patch (here the checks are switched off to show it)."""
    from wheelforge import patch as patch_mod
    from wheelforge.errors import PatchError

    monkeypatch.setattr(patch_mod, "check_patch", lambda _p: None)
    for name, target in (("leak", "/etc/passwd"), ("leak2", "setup.py")):
        p = tmp_path / f"{name}.patch"
        p.write_text(_new_link(name, target))
        with pytest.raises(PatchError) as exc:
            patch_mod.apply_series(src_tree, [p], project="demo 1.0")
        assert exc.value.what == f"patch {name}.patch made {name} a symlink to {target} in demo 1.0"
        assert not (src_tree / name).is_symlink()


def test_escaping_link_in_the_tree_is_caught(src_tree: Path, tmp_path: Path) -> None:
    from wheelforge.errors import PatchError
    from wheelforge.patch import apply_series

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
    from wheelforge.patch import refusals

    assert refusals(BENIGN) == []
    for p in sorted((REPO / "patches").rglob("*.patch")):
        assert refusals(p.read_text()) == [], p.name
