"""The nightly's opt-in ``canary:``: the newest upstream release of a canary recipe, found on
a fake package index (a real HTTP server on 127.0.0.1 speaking the PyPI JSON API) or in
a local git mirror's tags, fetched and verified for real, patched for real, then built in
a scratch index (the builder here publishes a made-up wheel, as in test_nightly's unit
tests: no nvcc, no torch).  Nothing reaches the real index; the night's status is the
pinned cells'."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from conftest import make_sdist, make_wheel, write_recipe
from test_outdated import PATCH, SETUP, mirror_of, serve, tag_release, tree, upstream_repo
from wheelforge import index, nightly
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.config import BuildConfig
from wheelforge.errors import VerifyError
from wheelforge.nightly.canary import CANARY_DIR, STACK_OFF
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import load_matrix
from wheelforge.recipe.model import Recipe

Build = Callable[[Recipe, BuildConfig, Reporter], pipeline.BuildResult]


def builder(calls: list[Recipe], verify_fails: bool = False, init: str = "") -> Build:
    """Publishes a made-up wheel of the recipe's version under its real build key into
    the configuration's index; for a canary that is the scratch index."""
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        calls.append(recipe)
        if verify_fails and recipe.version.public != "0.1.0":
            raise VerifyError(f"{recipe.name} {recipe.version}: import demo failed",
                              why="ModuleNotFoundError")
        key = identity.build_key(recipe, config, {"python": "py3"})
        code = init if recipe.version.public != "0.1.0" else ""
        wheel = make_wheel(config.work_dir / "dist", {"demo/__init__.py": code},
                           name=recipe.name, version=str(recipe.version))
        res = index.publish(config.index_dir, wheel, channel=None, cuda=None, torch=None,
                            archs=(), build_key=key)
        return pipeline.BuildResult(recipe, res.path, (), None, key)
    return build


def fake_index(root: Path, url: str, releases: dict[str, str]) -> dict[str, str]:
    """An sdist per version (setup.py of ``releases[version]``) under root/www/files and
    the PyPI JSON document of 'demo'; returns version -> sha256."""
    shas = {}
    for version, setup in releases.items():
        _, shas[version] = make_sdist(tree(root / f"src-{version}", setup),
                                      root / "www" / "files", "demo", version)
    doc = {"info": {"name": "demo"}, "releases": {
        v: [{"filename": f"demo-{v}.tar.gz", "packagetype": "sdist",
             "url": f"{url}/files/demo-{v}.tar.gz", "digests": {"sha256": sha}}]
        for v, sha in shas.items()}}
    (root / "www" / "pypi" / "demo").mkdir(parents=True, exist_ok=True)
    (root / "www" / "pypi" / "demo" / "json").write_text(json.dumps(doc))
    return shas


def project(root: Path, source: str, canary: object) -> tuple[Path, RecipeBook]:
    write_recipe(root, "demo", "format: 1\nname: demo\nversion: '0.1.0'\nsources:\n"
                 f"  - {source}\npatches: [0001-fix.patch]\nbuild: {{kind: pure}}\n",
                 {"0001-fix.patch": PATCH})
    path = root / "wheelforge.yaml"
    matrix: dict[str, object] = {"recipes": ["demo"],
                                 "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
                                 "archs": ["12.0"]}
    if canary is not None:
        matrix["canary"] = canary
    path.write_text(yaml.safe_dump({"matrix": matrix}, sort_keys=False))
    return path, RecipeBook(root / "recipes", root / "patches")


def night(root: Path, path: Path, book: RecipeBook, build: Build,
          stack_check: bool = False) -> nightly.NightlyReport:
    settings = nightly.Settings(index_dir=root / "index", cache_dir=root / "cache",
                                work_dir=root / "work", project_file=path,
                                stack_check=stack_check)
    return nightly.run(load_matrix(path, book.names()), book, settings,
                       reporter=Reporter(io.StringIO()), build=build)


def published(root: Path) -> tuple[list[str], list[str]]:
    """The real index's files (wheels and what goes with them) and pages."""
    idx = root / "index"
    return (sorted(p.name for p in (idx / "files").iterdir()),
            sorted(str(p.relative_to(idx)) for p in (idx / "simple").rglob("*") if p.is_file()))


@pytest.fixture
def pypi(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """demo 0.1.0 (pinned), 0.2.0 (the series applies) and 0.3.0 (it does not), served;
    the releases on the index are chosen by each test (root/www/pypi/demo/json)."""
    with serve(tmp_path / "www") as url:
        yield url, fake_index(tmp_path, url, {
            "0.1.0": SETUP, "0.2.0": SETUP.replace("line 18", "line XVIII"),
            "0.3.0": SETUP.replace("line 5\n", "line five\n")})


def only(tmp_path: Path, versions: list[str]) -> None:
    """Leave only ``versions`` in the index's JSON document."""
    doc = json.loads((tmp_path / "www" / "pypi" / "demo" / "json").read_text())
    doc["releases"] = {v: f for v, f in doc["releases"].items() if v in versions}
    (tmp_path / "www" / "pypi" / "demo" / "json").write_text(json.dumps(doc))


def sdist_source(url: str, sha: str) -> str:
    return (f"sdist: {{filename: demo-0.1.0.tar.gz, sha256: '{sha}', "
            f"url: '{url}/files/demo-0.1.0.tar.gz'}}")


def test_a_newer_release_that_applies_builds_and_verifies_in_scratch(
        tmp_path: Path, pypi: tuple[str, dict[str, str]]) -> None:
    url, shas = pypi
    only(tmp_path, ["0.1.0", "0.2.0"])
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": url, "timeout": 10})
    calls: list[Recipe] = []
    report = night(tmp_path, path, book, builder(calls))
    [cell] = report.results
    assert cell.status == "built" and not report.failed
    [c] = report.canaries
    assert (c.recipe, c.pinned, c.version, c.state) == ("demo", "0.1.0", "0.2.0", "passed")
    assert (c.applies, c.builds, c.verifies, c.stack) == ("yes", "yes", "yes", "not run")
    assert c.source == f"sdist:demo-0.2.0.tar.gz@sha256:{shas['0.2.0']}"
    assert c.reason == STACK_OFF
    assert c.line() == "canary demo 0.1.0 -> 0.2.0: applies yes / builds yes / verifies yes " \
                       "/ stack not run (stack: the night's stack check is off)"
    # the canary was built from the derived recipe: the new version and its sdist
    assert [str(r.version) for r in calls] == ["0.1.0", "0.2.0"]
    assert calls[1].sources[0].identity == c.source and calls[1].patches == calls[0].patches
    # nothing of 0.2.0 in the real index, its pages or its records; the scratch is gone
    files, pages = published(tmp_path)
    assert [f for f in files if f.endswith(".whl")] == ["demo-0.1.0-py3-none-any.whl"]
    assert not any("0.2.0" in f for f in files)
    assert not any("0.2.0" in (tmp_path / "index" / p).read_text() for p in pages)
    assert [r.version for r in index.load_records(tmp_path / "index")] == ["0.1.0"]
    assert list((tmp_path / "cache" / CANARY_DIR).iterdir()) == []
    # the report: JSON and HTML
    doc = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert doc["canaries"][0]["state"] == "passed" and doc["canaries"][0]["version"] == "0.2.0"
    page = (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()
    assert "<h2>Canaries</h2>" in page and "0.2.0" in page


def test_the_newest_release_is_tried_and_a_series_that_no_longer_applies_is_named(
        tmp_path: Path, pypi: tuple[str, dict[str, str]]) -> None:
    url, shas = pypi
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": url})
    calls: list[Recipe] = []
    report = night(tmp_path, path, book, builder(calls))
    [c] = report.canaries
    assert (c.version, c.state, c.failed_step) == ("0.3.0", "failed", "applies")
    assert (c.applies, c.builds, c.verifies, c.stack) == ("no", "not run", "not run", "not run")
    assert c.reason == "patch 0001-fix.patch does not apply to demo 0.3.0 (hunk 1 at setup.py:4)"
    assert c.line().startswith("canary demo 0.1.0 -> 0.3.0: applies no / builds not run / ")
    assert [str(r.version) for r in calls] == ["0.1.0"]  # the canary never reached a build
    assert not report.failed and report.results[0].status == "built"


def test_a_verification_failure_is_verifies_no(
        tmp_path: Path, pypi: tuple[str, dict[str, str]]) -> None:
    url, shas = pypi
    only(tmp_path, ["0.1.0", "0.2.0"])
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         ["demo"])  # the list form; its index-url is given below
    text = path.read_text().replace("canary:\n  - demo\n",
                                    f"canary: {{recipes: [demo], index-url: '{url}'}}\n")
    path.write_text(text)
    report = night(tmp_path, path, book, builder([], verify_fails=True))
    [c] = report.canaries
    assert (c.applies, c.builds, c.verifies, c.failed_step) == ("yes", "yes", "no", "verifies")
    assert c.reason == "demo 0.2.0: import demo failed" and not report.failed


@pytest.mark.parametrize(("init", "expected"), [
    ("", ("passed", "yes", None)),
    ("raise ImportError('demo 0.2.0 needs a newer torch')\n", ("failed", "no", "stack"))])
def test_the_canary_stack_check_in_scratch(
        tmp_path: Path, pypi: tuple[str, dict[str, str]], init: str,
        expected: tuple[str, str, str | None]) -> None:
    """The channel's published wheels and the canary's, installed together and imported
    (a real venv and pip), in the scratch index: nothing recorded in the real one."""
    url, shas = pypi
    only(tmp_path, ["0.1.0", "0.2.0"])
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": url})
    report = night(tmp_path, path, book, builder([], init=init), stack_check=True)
    [c] = report.canaries
    assert (c.state, c.stack, c.failed_step) == expected, c
    assert (c.applies, c.builds, c.verifies) == ("yes", "yes", "yes")
    if c.stack == "no":
        assert "demo 0.2.0 needs a newer torch" in c.reason
    # the night's own stack check, of the pinned 0.1.0, is good and is the one recorded
    assert [s.state for s in report.stacks] == ["good"] and not report.failed
    recorded = [p for p in (tmp_path / "index").rglob("*stack*") if p.is_file()]
    assert all("0.2.0" not in p.read_text() for p in recorded)


@pytest.mark.unit
def test_an_unreachable_index_is_not_checked_and_the_night_goes_on(
        tmp_path: Path, pypi: tuple[str, dict[str, str]]) -> None:
    url, shas = pypi
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": "http://127.0.0.1:9", "timeout": 5})
    report = night(tmp_path, path, book, builder([]))
    [c] = report.canaries
    assert (c.state, c.version, c.applies) == ("not checked", None, "not run")
    assert c.reason.startswith("http://127.0.0.1:9/pypi/demo/json: cannot be read")
    assert c.line().startswith("canary demo 0.1.0: not checked (http://127.0.0.1:9/")
    assert report.results[0].status == "built" and not report.failed


@pytest.mark.unit
def test_up_to_date_and_no_canary_section(tmp_path: Path,
                                          pypi: tuple[str, dict[str, str]]) -> None:
    url, shas = pypi
    only(tmp_path, ["0.1.0"])
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": url})
    [c] = night(tmp_path, path, book, builder([])).canaries
    assert (c.state, c.reason) == ("up to date", "no release after 0.1.0")
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]), None)
    report = night(tmp_path, path, book, builder([]))
    assert report.canaries == ()
    assert "Canaries" not in (tmp_path / "index" / "reports" / "nightly-latest.html").read_text()


def test_a_git_canary_tries_the_newest_tag_of_the_mirror(tmp_path: Path) -> None:
    up, pinned = upstream_repo(tmp_path, SETUP, "v0.1.0")
    tagged = tag_release(up, SETUP.replace("line 18", "line XVIII"), "v0.2.0")
    mirror = mirror_of(up, tmp_path)
    remote = "http://127.0.0.1:9/demo.git"  # never contacted: the mirror serves it
    path, book = project(tmp_path, f"git: {{url: '{remote}', commit: {pinned}, tag: v0.1.0}}",
                         {"recipes": ["demo"], "index-url": "http://127.0.0.1:9", "timeout": 5})
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({"defaults": {"git-mirrors": {remote: str(mirror)}}, **data}))
    calls: list[Recipe] = []
    report = night(tmp_path, path, book, builder(calls))
    [c] = report.canaries
    assert (c.version, c.state, c.applies, c.builds, c.verifies) == (
        "0.2.0", "passed", "yes", "yes", "yes")
    assert c.source == f"git:{remote}@{tagged}"
    assert calls[-1].sources[0].identity == c.source
    assert not any("0.2.0" in f for f in published(tmp_path)[0])


def test_the_console_shows_the_canary_and_the_exit_status_stays_the_cells(
        tmp_path: Path, pypi: tuple[str, dict[str, str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    from wheelforge.cli.nightly import _echo_report, _raise_if_failed

    url, shas = pypi
    path, book = project(tmp_path, sdist_source(url, shas["0.1.0"]),
                         {"recipes": ["demo"], "index-url": url})
    report = night(tmp_path, path, book, builder([]))
    reports = tmp_path / "index" / "reports"
    _echo_report(report, reports)
    _raise_if_failed(report, reports)  # a failed canary: no error, the cells built
    out, err = capsys.readouterr()
    assert "canary demo 0.1.0 -> 0.3.0: applies no / builds not run / verifies not run / " \
           "stack not run (applies: patch 0001-fix.patch does not apply" in out
    assert "warning: the newest upstream release of demo does not pass its canary" in err


@pytest.mark.e2e
def test_end_to_end_the_real_nightly_builds_the_canary_and_publishes_only_the_pin(
        tmp_path: Path) -> None:
    """`wheelforge nightly` with the real builder (pip, the managed environment shared
    through the user's cache, the real index): the pinned 0.1.0 is published, the canary
    0.2.0 is patched, built, verified (its import) and stack-checked, and left nowhere in
    the index."""
    from conftest import REPO
    from test_nightly import clean_env, wheelforge
    from wheelforge.builder.config import default_cache_dir

    notes = "".join(f"line {i}\n" for i in range(1, 21))
    patch = ("--- a/NOTES\n+++ b/NOTES\n@@ -4,3 +4,3 @@\n line 4\n-line 5\n+LINE 5\n"
             " line 6\n")
    www = tmp_path / "www"
    with serve(www) as url:
        shas = {}
        for version in ("0.1.0", "0.2.0"):
            src = tmp_path / f"src-{version}"
            (src / "demo").mkdir(parents=True)
            (src / "demo" / "__init__.py").write_text(f"VERSION = {version!r}\n")
            (src / "NOTES").write_text(notes)
            (src / "pyproject.toml").write_text(
                '[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                f'"setuptools.build_meta"\n[project]\nname = "demo"\nversion = "{version}"\n'
                '[tool.setuptools]\npackages = ["demo"]\n')
            _, shas[version] = make_sdist(src, www / "files", "demo", version)
        doc = {"releases": {v: [{"filename": f"demo-{v}.tar.gz", "packagetype": "sdist",
                                 "url": f"{url}/files/demo-{v}.tar.gz",
                                 "digests": {"sha256": sha}}] for v, sha in shas.items()}}
        (www / "pypi" / "demo").mkdir(parents=True)
        (www / "pypi" / "demo" / "json").write_text(json.dumps(doc))
        write_recipe(tmp_path, "demo", "format: 1\nname: demo\nversion: '0.1.0'\nsources:\n"
                     f"  - sdist: {{filename: demo-0.1.0.tar.gz, sha256: '{shas['0.1.0']}', "
                     f"url: '{url}/files/demo-0.1.0.tar.gz'}}\npatches: [0001-notes.patch]\n"
                     "build: {kind: pure}\nverify: {imports: [demo]}\n",
                     {"0001-notes.patch": patch})
        (tmp_path / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
            "recipes": ["demo"], "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}],
            "archs": ["12.0"], "canary": {"recipes": ["demo"], "index-url": url}}}))
        env = dict(clean_env(), PYTHONPATH=str(REPO / "src"))
        env.pop("WHEELFORGE_STACK_CHECK")  # conftest's "off": this test checks the stack
        res = wheelforge("nightly", "--config", tmp_path / "wheelforge.yaml", "--recipes",
                         tmp_path / "recipes", "--index", tmp_path / "index", "--cache-dir",
                         default_cache_dir(), "--work-dir", tmp_path / "work", cwd=tmp_path,
                         env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert ("canary demo 0.1.0 -> 0.2.0: applies yes / builds yes / verifies yes / "
            "stack yes\n") in res.stdout
    files = sorted(p.name for p in (tmp_path / "index" / "files").iterdir())
    assert "demo-0.1.0+wf-py3-none-any.whl" in files and not any("0.2.0" in f for f in files)
    pages = [p for p in (tmp_path / "index").rglob("*") if p.is_file()
             and p.suffix in (".html", ".json", ".txt") and "reports" not in p.parts]
    assert pages and not [p for p in pages if "demo-0.2.0" in p.read_text()
                          or "demo==0.2.0" in p.read_text()]
