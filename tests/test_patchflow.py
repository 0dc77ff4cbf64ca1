"""`wheelforge patch NAME start|export|rebase`: the series as a git repository and back,
on a local fixture (an sdist made here, a two-patch series from git format-patch) and on
the shipped causal-conv1d recipe."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, make_sdist, write_recipe
from test_outdated import mirror_of, tag_release, upstream_repo
from wheelforge.errors import RecipeError
from wheelforge.maintain.recipefile import set_patches

SETUP = "".join(f"line {i}\n" for i in range(1, 41))
RECIPE = """\
# demo: a fixture.  This comment must survive an export.
format: 1
name: demo
version: "{version}"
sources:
  - sdist: {{filename: demo-{version}.tar.gz, sha256: "{sha}"}}
patches:
  # the first fix
  - 0001-first-fix.patch
  - 0002-second-fix.patch  # trailing comment
# build below
build: {{kind: pure}}
"""


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=Maint", "-c", "user.email=m@example.org",
                           "-c", "commit.gpgsign=false", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def wf(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "wheelforge", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def source_tree(root: Path, setup: str = SETUP) -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text(setup)
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("*.egg-info\n")  # ignored files are still source
    (root / "demo.egg-info").mkdir()
    (root / "demo.egg-info" / "PKG-INFO").write_text("Name: demo\n")
    return root


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tmp/recipes/demo.yaml, tmp/patches/demo/000{1,2}-*.patch, tmp/sdists/demo-1.0."""
    tree = source_tree(tmp_path / "src")
    _, sha = make_sdist(tree, tmp_path / "sdists", "demo", "1.0")
    scratch = tmp_path / "scratch"
    shutil.copytree(tree, scratch)
    git("init", "-q", cwd=scratch)
    git("add", "-A", "-f", cwd=scratch)
    git("commit", "-qm", "base", cwd=scratch)
    (scratch / "setup.py").write_text(SETUP.replace("line 5\n", "LINE FIVE\n"))
    git("commit", "-qam", "First fix\n\nWhy upstream is wrong, in a body.", cwd=scratch)
    (scratch / "pkg" / "__init__.py").write_text("x = 2\n")
    git("commit", "-qam", "Second fix", cwd=scratch)
    out = tmp_path / "fp"
    git("format-patch", "-q", "-o", str(out), "HEAD~2", cwd=scratch)
    pdir = tmp_path / "patches" / "demo"
    pdir.mkdir(parents=True)
    for src, name in zip(sorted(out.iterdir()), ["0001-first-fix.patch",
                                                 "0002-second-fix.patch"], strict=True):
        shutil.copy(src, pdir / name)  # format-patch output with signature and commit ids
    write_recipe(tmp_path, "demo", RECIPE.format(version="1.0", sha=sha))
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for d in ("recipes", "patches") for p in sorted((root / d).rglob("*")) if p.is_file()}


def start(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return wf("patch", "demo", "start", "--sources", "sdists", "--cache-dir", "cache", *extra,
              cwd=root)


def test_round_trip_reproduces_the_series_byte_for_byte(project: Path) -> None:
    before = snapshot(project)
    res = start(project)
    assert res.returncode == 0, res.stderr
    work = project / "patch-work" / "demo"
    assert git("log", "--format=%s|%an", "upstream..HEAD", cwd=work).splitlines() == [
        "Second fix|Maint", "First fix|Maint"]
    assert git("status", "--porcelain", "--untracked-files=all", cwd=work) == ""
    assert (work / "demo.egg-info" / "PKG-INFO").is_file()  # ignored by .gitignore, committed
    assert git("ls-files", "demo.egg-info", cwd=work) == "demo.egg-info/PKG-INFO"
    res = wf("patch", "demo", "export", cwd=project)
    assert res.returncode == 0, res.stderr
    assert "unchanged  0001-first-fix.patch" in res.stdout
    assert snapshot(project) == before
    assert git("status", "--porcelain", "--untracked-files=all", cwd=work) == ""


def test_export_writes_edits_renumbers_and_keeps_comments(project: Path) -> None:
    assert start(project).returncode == 0
    work = project / "patch-work" / "demo"
    first = git("rev-parse", "HEAD~1", cwd=work)
    git("rebase", "-q", "--onto", "upstream", first, cwd=work)  # drop the first fix
    (work / "pkg" / "new.py").write_text("y = 1\n")
    git("add", "pkg/new.py", cwd=work)
    git("commit", "-qm", "Add pkg/new.py: a third fix", cwd=work)
    res = wf("patch", "demo", "export", cwd=project)
    assert res.returncode == 0, res.stderr
    pdir = project / "patches" / "demo"
    assert sorted(p.name for p in pdir.iterdir()) == [
        "0001-second-fix.patch", "0002-add-pkg-new-py-a-third-fix.patch"]
    text = (project / "recipes" / "demo.yaml").read_text()
    assert text == RECIPE.format(version="1.0", sha=text.split('sha256: "')[1][:64]).replace(
        "  # the first fix\n  - 0001-first-fix.patch\n  - 0002-second-fix.patch  # trailing "
        "comment\n", "  - 0001-second-fix.patch  # trailing comment\n"
        "  - 0002-add-pkg-new-py-a-third-fix.patch\n")
    third = (pdir / "0002-add-pkg-new-py-a-third-fix.patch").read_text()
    assert third.startswith("From 0000000000000000000000000000000000000000 ")
    assert "Subject: [PATCH 2/2] Add pkg/new.py: a third fix" in third
    assert not third.rstrip().endswith(git("--version", cwd=work).split()[-1])  # no signature
    assert wf("check", "--recipes", "recipes", cwd=project).returncode == 0
    assert git("status", "--porcelain", cwd=work) == ""
    again = snapshot(project)
    assert wf("patch", "demo", "export", cwd=project).returncode == 0
    assert snapshot(project) == again  # idempotent


def test_export_refuses_a_symlink_and_writes_nothing(project: Path) -> None:
    assert start(project).returncode == 0
    work = project / "patch-work" / "demo"
    (work / "link").symlink_to("setup.py")
    git("add", "link", cwd=work)
    git("commit", "-qm", "Add a link", cwd=work)
    before = snapshot(project)
    res = wf("patch", "demo", "export", cwd=project)
    assert res.returncode == 5, res.stderr
    assert "breaks the patch rules" in res.stderr
    assert "0003-add-a-link.patch" in res.stderr and "symlink" in res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(project) == before


def test_export_refuses_uncommitted_changes(project: Path) -> None:
    assert start(project).returncode == 0
    (project / "patch-work" / "demo" / "setup.py").write_text("changed\n")
    res = wf("patch", "demo", "export", cwd=project)
    assert res.returncode == 5
    assert "changes that are not committed" in res.stderr and "fix:" in res.stderr


def test_start_refuses_a_nonempty_directory(project: Path) -> None:
    (project / "busy").mkdir()
    (project / "busy" / "notes.txt").write_text("mine\n")
    res = start(project, "--to", "busy")
    assert res.returncode == 2
    assert res.stderr.startswith("config error: busy already exists and is not empty")
    assert (project / "busy" / "notes.txt").read_text() == "mine\n"


def test_start_verifies_the_source(project: Path) -> None:
    (project / "sdists" / "demo-1.0.tar.gz").write_bytes(b"not the pinned bytes")
    res = start(project)
    assert res.returncode == 4, res.stderr
    assert "does not match the recipe" in res.stderr
    assert not (project / "patch-work" / "demo").exists()


def test_rebase_onto_a_new_sdist(project: Path, tmp_path: Path) -> None:
    assert start(project).returncode == 0
    # 1.1 changes line 30 only: both patches still apply
    new = source_tree(tmp_path / "v11", SETUP.replace("line 30\n", "line thirty\n"))
    sdist, sha = make_sdist(new, tmp_path / "new", "demo", "1.1")
    res = wf("patch", "demo", "rebase", "--onto", "1.1", "--sdist", str(sdist), "--sha256", sha,
             "--cache-dir", "cache", cwd=project)
    assert res.returncode == 0, res.stderr
    assert "the series applies to demo 1.1" in res.stdout
    assert f"sha256: {sha}" in res.stdout
    work = project / "patch-work" / "demo"
    assert "line thirty" in (work / "setup.py").read_text()
    assert "LINE FIVE" in (work / "setup.py").read_text()
    assert git("tag", cwd=work).split() == ["upstream", "upstream-1.0"]


def test_rebase_stops_at_the_conflicting_patch(project: Path, tmp_path: Path) -> None:
    assert start(project).returncode == 0
    new = source_tree(tmp_path / "v12", SETUP.replace("line 5\n", "line five, upstream\n"))
    sdist, sha = make_sdist(new, tmp_path / "new", "demo", "1.2")
    res = wf("patch", "demo", "rebase", "--onto", "1.2", "--sdist", str(sdist), "--sha256", sha,
             "--cache-dir", "cache", cwd=project)
    assert res.returncode == 5, res.stderr
    first = res.stderr.splitlines()[0]
    assert first == ("patch error: patch 0001-first-fix.patch (First fix) conflicts with demo "
                     "1.2 at setup.py:5"), res.stderr
    assert "git rebase --continue" in res.stderr
    assert (project / "patch-work" / "demo" / ".git" / "rebase-merge").is_dir()


def test_rebase_of_an_sdist_recipe_needs_the_new_sdist(project: Path) -> None:
    assert start(project).returncode == 0
    res = wf("patch", "demo", "rebase", "--onto", "1.1", cwd=project)
    assert res.returncode == 2
    assert "--sdist PATH_OR_URL --sha256 HEX" in res.stderr


@pytest.mark.unit
@pytest.mark.parametrize(("text", "names", "want"), [
    ("a: 1\npatches: [x.patch]  # c\nbuild: 2\n", ["y.patch", "x.patch"],
     "a: 1\npatches: [y.patch, x.patch]  # c\nbuild: 2\n"),
    ("a: 1\nbuild: 2\n", ["y.patch"], "a: 1\npatches:\n  - y.patch\nbuild: 2\n"),
    ("a: 1\npatches:\n- x.patch\n- z.patch\nbuild: 2\n", [],
     "a: 1\npatches: []\nbuild: 2\n"),
    ("patches:\n    - '0001-x.patch'   # why\n    # note\n    - 0002-z.patch\nb: 1\n",
     ["0001-z.patch"], "patches:\n    # note\n    - 0001-z.patch\nb: 1\n"),
])
def test_patches_list_edited_as_text(text: str, names: list[str], want: str) -> None:
    assert set_patches(text, names, Path("r.yaml")) == want


@pytest.mark.unit
def test_patches_list_that_cannot_be_edited_as_text() -> None:
    with pytest.raises(RecipeError, match="cannot edit the patches: list") as exc:
        set_patches("patches: &a [x.patch]\nb: 1\n", ["y.patch"], Path("r.yaml"))
    assert "  - y.patch" in exc.value.fix


def test_causal_conv1d_round_trip(tmp_path: Path, shared_cache: Path) -> None:
    """The shipped recipe: start and export with no edit leave every file as it is."""
    for d in ("recipes", "patches"):
        shutil.copytree(REPO / d, tmp_path / d)
    before = snapshot(tmp_path)
    res = wf("patch", "causal-conv1d", "start", "--cache-dir", str(shared_cache), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("-") >= 7
    res = wf("patch", "causal-conv1d", "export", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert snapshot(tmp_path) == before
    assert git("status", "--porcelain", cwd=tmp_path / "patch-work" / "causal-conv1d") == ""


def test_git_recipe_rebase_onto_a_tag_then_export(tmp_path: Path) -> None:
    up, v10 = upstream_repo(tmp_path, SETUP, "v1.0")
    v11 = tag_release(up, "first\n" + SETUP, "v1.1")  # shifts every line: the patch moves
    mirror = mirror_of(up, tmp_path)
    remote = "http://127.0.0.1:9/demo.git"  # never contacted: the mirror serves it
    patch = ("--- a/setup.py\n+++ b/setup.py\n@@ -4,3 +4,3 @@\n line 4\n-line 5\n+LINE 5\n"
             " line 6\n")
    recipe = (f"format: 1\nname: demo\nversion: '1.0'\nsources:\n  - git: {{url: '{remote}', "
              f"commit: {v10}, tag: v1.0}}\npatches: [0001-fix.patch]\nbuild: {{kind: pure}}\n")
    write_recipe(tmp_path, "demo", recipe, {"0001-fix.patch": patch})
    mirror_arg = ("--git-mirror", f"{remote}={mirror}")
    res = wf("patch", "demo", "start", "--cache-dir", "cache", *mirror_arg, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    work = tmp_path / "patch-work" / "demo"
    assert git("log", "-1", "--format=%s", cwd=work) == "fix"  # a plain diff: named by file
    res = wf("patch", "demo", "rebase", "--onto", "v1.1", "--cache-dir", "cache", *mirror_arg,
             cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"commit: {v11}" in res.stdout and "tag: v1.1" in res.stdout
    assert 'version: "1.1"' in res.stdout
    res = wf("patch", "demo", "export", cwd=tmp_path)
    assert res.returncode == 5  # the recipe still pins 1.0
    assert "the recipe pins git:" in res.stderr.splitlines()[0]
    (tmp_path / "recipes" / "demo.yaml").write_text(
        recipe.replace(v10, v11).replace("v1.0", "v1.1").replace("'1.0'", "'1.1'"))
    res = wf("patch", "demo", "export", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "patches" / "demo" / "0001-fix.patch").read_text()
    assert "@@ -3,7 +3,7 @@ line 1\n line 2\n" in text and "Subject: [PATCH] fix" in text
    assert wf("check", cwd=tmp_path).returncode == 0
