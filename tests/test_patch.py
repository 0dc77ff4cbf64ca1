from __future__ import annotations

from pathlib import Path

import pytest

from wheelforge.builder.source.patch import apply_series, hunks
from wheelforge.errors import PatchError

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 31))


def make_patch(path: Path, old: str, new: str, start: int, file: str = "setup.py") -> Path:
    """A one-line change at ``start`` with a line of context on each side."""
    before, after = f"line {start - 1}", f"line {start + 1}"
    path.write_text(f"--- a/{file}\n+++ b/{file}\n@@ -{start - 1},3 +{start - 1},3 @@\n"
                    f" {before}\n-{old}\n+{new}\n {after}\n")
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "proj"
    t.mkdir()
    (t / "setup.py").write_text(ORIGINAL)
    return t


def test_series_applies_in_order(tree: Path, tmp_path: Path) -> None:
    p1 = make_patch(tmp_path / "0001.patch", "line 3", "LINE 3", 3)
    p2 = make_patch(tmp_path / "0002.patch", "LINE 3", "LINE THREE", 3)
    apply_series(tree, [p1, p2], project="demo 1.0")
    assert "LINE THREE\n" in (tree / "setup.py").read_text()
    assert not tree.with_name("proj.patching").exists()


def test_failing_patch_leaves_tree_untouched(tree: Path, tmp_path: Path) -> None:
    p1 = make_patch(tmp_path / "0001-good.patch", "line 3", "LINE 3", 3)
    two_hunks = tmp_path / "0002-bad.patch"
    two_hunks.write_text("--- a/setup.py\n+++ b/setup.py\n"
                         "@@ -4,3 +4,3 @@\n line 4\n-line 5\n+LINE 5\n line 6\n"
                         "@@ -19,3 +19,3 @@\n line 19\n-no such line\n+x\n line 21\n")
    with pytest.raises(PatchError) as exc:
        apply_series(tree, [p1, two_hunks], project="demo 1.0")
    assert exc.value.what == \
        "patch 0002-bad.patch does not apply to demo 1.0 (hunk 2 at setup.py:19)"
    assert "no patch of the series was applied" in exc.value.why
    assert (tree / "setup.py").read_text() == ORIGINAL  # not even 0001
    assert not tree.with_name("proj.patching").exists()


def test_missing_file(tree: Path, tmp_path: Path) -> None:
    p = make_patch(tmp_path / "0001.patch", "line 3", "x", 3, file="nope.py")
    with pytest.raises(PatchError, match="nope.py"):
        apply_series(tree, [p], project="demo")


@pytest.mark.unit
def test_hunks() -> None:
    text = "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n@@ -10 +10 @@\n--- a/b.py\n+++ b/b.py\n" \
           "@@ -7,3 +7,4 @@\n"
    assert [(h.file, h.index, h.old_start) for h in hunks(text)] == [
        ("a.py", 1, 1), ("a.py", 2, 10), ("b.py", 3, 7)]


def test_shipped_series_applies_inside_a_git_repo(tmp_path: Path) -> None:
    """git apply must patch the tree, not the repository that happens to enclose it."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    t = tmp_path / "deep" / "proj"
    t.mkdir(parents=True)
    (t / "setup.py").write_text(ORIGINAL)
    apply_series(t, [make_patch(tmp_path / "p.patch", "line 3", "LINE 3", 3)], project="demo")
    assert "LINE 3\n" in (t / "setup.py").read_text()
