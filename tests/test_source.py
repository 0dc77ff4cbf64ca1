from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import write_recipe
from wheelforge.builder.source.fetch import cache_path, extract, fetch
from wheelforge.errors import SourceError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import Recipe


def sdist_bytes(name: str = "demo-1.0") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"print('hi')\n"
        ti = tarfile.TarInfo(f"{name}/setup.py")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def recipe_for(tmp_path: Path, sources: str) -> Recipe:
    body = f"format: 1\nname: demo\nversion: '1.0'\nsources:\n{sources}\nbuild: {{kind: pure}}\n"
    rdir = write_recipe(tmp_path / "book", "demo", body)
    return RecipeBook(rdir, tmp_path / "book" / "patches").load("demo")


def sdist_entry(sha: str, url: str | None = None) -> str:
    line = f"  - sdist: {{filename: demo-1.0.tar.gz, sha256: '{sha}'"
    return line + (f", url: '{url}'}}" if url else "}")


def test_from_sources_dir_then_cache(tmp_path: Path) -> None:
    data = sdist_bytes()
    sha = hashlib.sha256(data).hexdigest()
    offline = tmp_path / "offline"
    offline.mkdir()
    (offline / "demo-1.0.tar.gz").write_bytes(data)
    r = recipe_for(tmp_path, sdist_entry(sha, "http://127.0.0.1:9/demo-1.0.tar.gz"))
    cache = tmp_path / "cache"
    got = fetch(r, cache, [offline])
    assert got.origin == str(offline / "demo-1.0.tar.gz")
    assert got.archive == cache_path(cache, r.sources[0])
    (offline / "demo-1.0.tar.gz").unlink()
    assert fetch(r, cache, []).origin == "cache"
    root = extract(got.archive, tmp_path / "x")
    assert (root / "setup.py").is_file() and root.name == "demo-1.0"


def test_hash_mismatch_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    offline = tmp_path / "offline"
    offline.mkdir()
    (offline / "demo-1.0.tar.gz").write_bytes(b"tampered")
    good = tmp_path / "good"
    good.mkdir()
    data = sdist_bytes()
    (good / "demo-1.0.tar.gz").write_bytes(data)
    r = recipe_for(tmp_path, sdist_entry(hashlib.sha256(data).hexdigest()))
    with pytest.raises(SourceError) as exc:
        fetch(r, tmp_path / "cache", [offline, good])
    assert "does not match the recipe" in exc.value.what
    assert hashlib.sha256(b"tampered").hexdigest() in exc.value.why


def test_unreachable_everywhere(tmp_path: Path) -> None:
    r = recipe_for(tmp_path, sdist_entry("0" * 64, "http://127.0.0.1:9/demo-1.0.tar.gz"))
    with pytest.raises(SourceError) as exc:
        fetch(r, tmp_path / "cache", [])
    assert "no source of demo 1.0 could be fetched" in exc.value.what
    assert "--sources DIR" in exc.value.fix


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    r = tmp_path / "upstream"
    r.mkdir()
    git("init", "-q", cwd=r)
    (r / "setup.py").write_text("v = 1\n")
    git("add", ".", cwd=r)
    git("commit", "-qm", "one", cwd=r)
    first = git("rev-parse", "HEAD", cwd=r)
    git("tag", "v1.0", cwd=r)
    (r / "setup.py").write_text("v = 2\n")
    git("commit", "-qam", "two", cwd=r)
    second = git("rev-parse", "HEAD", cwd=r)
    return r, first, second


@pytest.mark.integration
def test_git_source_pinned_commit(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    url, first, _ = repo
    r = recipe_for(tmp_path, f"  - git: {{url: '{url}', commit: {first}, tag: v1.0}}")
    got = fetch(r, tmp_path / "cache", [])
    root = extract(got.archive, tmp_path / "x")
    assert (root / "setup.py").read_text() == "v = 1\n"
    assert fetch(r, tmp_path / "cache", []).origin == "cache"


@pytest.mark.integration
def test_git_tag_cross_checked(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    url, _, second = repo
    r = recipe_for(tmp_path, f"  - git: {{url: '{url}', commit: {second}, tag: v1.0}}")
    with pytest.raises(SourceError, match="tag v1.0 of demo points at"):
        fetch(r, tmp_path / "cache", [])


@pytest.mark.integration
def test_git_unknown_commit(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    url = repo[0]
    r = recipe_for(tmp_path, f"  - git: {{url: '{url}', commit: {'c' * 40}}}")
    with pytest.raises(SourceError, match="is not in"):
        fetch(r, tmp_path / "cache", [])


@pytest.mark.integration
def test_mirrors_tried_in_order(tmp_path: Path, repo: tuple[Path, str, str]) -> None:
    url, first, _ = repo
    sources = (sdist_entry("0" * 64, "http://127.0.0.1:9/demo-1.0.tar.gz") +
               f"\n  - git: {{url: '{url}', commit: {first}}}")
    got = fetch(recipe_for(tmp_path, sources), tmp_path / "cache", [])
    assert got.origin == str(url)


def test_unsafe_archive_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        ti = tarfile.TarInfo("../../escaped.txt")
        ti.size = 1
        tf.addfile(ti, io.BytesIO(b"x"))
    with pytest.raises(SourceError, match="refused member '../../escaped.txt'"):
        extract(evil, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()
