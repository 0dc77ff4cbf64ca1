"""What wheelforge says is what it does (issue 53, items 4-9): the printed install lines run
where they are pasted, serve's banner names an address other machines reach, check and
list say each problem on its own line with its file, an interrupted night's report says
how far each cell came, the docs' links resolve, and the pages' text is legible in dark
mode and breaks wheel names only between their parts (headless Chromium)."""

from __future__ import annotations

import io
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from browser import COLOURS, LINES, contrast, probe
from conftest import make_sdist, make_wheel, pure_recipe, require_tool, write_recipe
from test_index_clients import CU130, DEMO_LOCAL, pub
from wheelforge import index, nightly
from wheelforge._log import Reporter
from wheelforge.builder import pipeline
from wheelforge.builder.artifact import identity
from wheelforge.builder.config import BuildConfig
from wheelforge.index.health import StackStatus
from wheelforge.recipe.format import RecipeBook
from wheelforge.recipe.matrix import load_matrix
from wheelforge.recipe.model import Recipe

REPO = Path(__file__).resolve().parent.parent
WF = [sys.executable, "-m", "wheelforge"]
SYSTEM_PATH = "/usr/bin:/bin"


def wf(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WF, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    root = tmp / "index"
    pub(root, tmp / "dist", "wf-demo", DEMO_LOCAL, "local", requires="wf-dep", target=CU130)
    pub(root, tmp / "dist", "wf-helper", "0.6.0", "local")
    return root


# ------------------------------------------------------------ 8. the docs' relative links

def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug, n = _slug(heading), 1
        while slug in found:  # a second heading of the same text gets -1, -2...
            slug = f"{_slug(heading)}-{n}"
            n += 1
        found.add(slug)
    return found | set(re.findall(r'<a (?:name|id)="([^"]+)"', text))


def test_every_relative_link_of_the_readme_and_docs_resolves() -> None:
    """docs/usage.md and docs/shipped-recipes.md linked docs/docs/*.md (8 links): every
    relative link of README.md and docs/*.md names a file that exists, and its #anchor a
    heading of that file."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not broken, "\n".join(broken)


# ------------------------------------------------- 5. the printed lines, pasted as printed

def _commands(text: str) -> list[str]:
    """The shell commands of printed lines: each non-comment line, split at &&, || and ;."""
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and not line.endswith(":"):
            out += [part.strip() for part in re.split(r"&&|\|\||;", line) if part.strip()]
    return out


def _resolves_under_the_system_path(word: str) -> bool:
    done = subprocess.run(["env", "-i", f"PATH={SYSTEM_PATH}", "sh", "-c",
                           f"command -v {shlex.quote(word)}"], capture_output=True, text=True)
    return done.returncode == 0


def test_every_printed_command_runs_with_only_the_system_path(local: Path) -> None:
    """build's last lines (and consumer's): `uv venv ...` needed uv on PATH, which the
    README's set-up never puts there.  Each command's first word resolves in a shell
    whose PATH holds only the system's directories, and `--version` of each runs."""
    from wheelforge.cli._options import install_lines

    commands = _commands(install_lines(local, None, None))
    assert len(commands) == 4, commands  # wheelforge install; test -d; uv venv; uv pip install
    for command in commands:
        first = shlex.split(command)[0]
        assert _resolves_under_the_system_path(first), command
        done = subprocess.run(["env", "-i", f"PATH={SYSTEM_PATH}", "sh", "-c",
                               f"{shlex.quote(first)} --version"], capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr)


def test_the_landing_page_says_where_its_commands_are_and_which_client_keeps_what(
        local: Path) -> None:
    """The page started with a bare `wheelforge` and promised that later `pip install -U`
    keeps the wheels right above the uv line, whose venv keeps nothing."""
    page = (local / "index.html").read_text(encoding="utf-8")
    assert "<code>.venv/bin/wheelforge</code> in a wheelforge checkout" in page
    assert "<code>pip install uv</code>" in page
    assert "uv keeps no settings in a venv" in page
    assert "<code>wheelforge install</code> (pip) also writes the venv's" in page


# ------------------------------------------------------- 4. and 9. serve's banner, Ctrl-C

def _serve(index_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*WF, "serve", "--index", str(index_dir), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _banner(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    lines = []
    while not lines or " pip install " not in lines[-1]:  # the uv line ends the banner
        line = proc.stdout.readline()
        assert line, (lines, proc.stderr.read() if proc.stderr else "")
        lines.append(line.rstrip("\n"))
    return lines


def test_serve_on_every_address_prints_lines_that_reach_it_from_elsewhere(
        local: Path, tmp_path: Path) -> None:
    """`serve --host 0.0.0.0` printed install lines with http://0.0.0.0:PORT/, which work
    on no other machine; then Ctrl-C ended it with exit 0, where the table says 130."""
    from wheelforge.index.serve import reachable_hosts

    proc = _serve(local, "--host", "0.0.0.0")
    try:
        lines = _banner(proc)
        port = int(re.search(r"http://0\.0\.0\.0:(\d+)/", lines[0]).group(1))  # type: ignore[union-attr]
        assert all("0.0.0.0" not in line for line in lines[1:]), lines
        hosts = reachable_hosts("0.0.0.0")
        urls = re.findall(r"http://([^/:\s]+|\[[^\]]+\]):(\d+)/", "\n".join(lines[1:]))
        assert urls and {int(p) for _, p in urls} == {port}
        if hosts:  # the lines name a host that reaches the server
            assert {h for h, _ in urls} <= set(hosts), (urls, hosts)
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"http://{hosts[0]}:{port}/simple/", timeout=10) as answer:
                assert answer.status == 200
        else:  # no network: the banner says what to replace
            assert any("replace HOST" in line for line in lines), lines
        assert any("on another machine" in line for line in lines), lines
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.endswith("(Ctrl-C)\n") and "Traceback" not in err


def test_serve_on_loopback_says_nothing_of_other_machines(local: Path) -> None:
    proc = _serve(local)
    try:
        lines = _banner(proc)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lines[0].startswith(f"serving {local} at http://127.0.0.1:")
    assert not any("other machine" in line for line in lines), lines
    assert proc.returncode == 143


# --------------------------------------------------------------------- 6. check and list

def _recipes(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    src = root / "src" / "good"
    (src / "good").mkdir(parents=True)
    (src / "good" / "__init__.py").write_text("")
    _, sha = make_sdist(src, root / "sdists", "good", "0.1.0")
    write_recipe(root, "good", pure_recipe("good", sha))
    (root / "recipes" / "bar.yaml").write_text("format: 1\nname: bar\n")
    (root / "recipes" / "foo.yaml").write_text("format: 1\nname: foo\nversion: [\n")
    return root


def test_check_says_each_problem_on_its_own_line_naming_its_file(tmp_path: Path) -> None:
    """`...got Nonerecipes/foo.yaml: line 8...`, and `in "<unicode string>"` for a YAML
    syntax error."""
    root = _recipes(tmp_path)
    res = wf("check", cwd=root)
    assert res.returncode == 3, res.stderr
    problems = [line.strip() for line in res.stderr.splitlines() if line.startswith("    ")]
    assert problems == [
        "recipes/bar.yaml: version: is required",
        "recipes/bar.yaml: sources: is required: a list of one or more pinned sources "
        "(mirrors)",
        "recipes/bar.yaml: build: is required and must be a mapping",
        "recipes/foo.yaml: line 4, column 1: expected the node content, but found "
        "'<stream end>' (while parsing a flow node)"], res.stderr
    assert "<unicode string>" not in res.stderr


def test_list_shows_the_good_recipes_and_names_the_broken_ones(tmp_path: Path) -> None:
    """One broken recipe made `list` fail for all."""
    root = _recipes(tmp_path)
    res = wf("list", cwd=root)
    assert res.returncode == 3, res.stderr
    assert res.stdout.split() == ["good", "0.1.0", "pure"]
    assert "2 recipe(s) have problems" in res.stderr
    assert "recipes/foo.yaml: line 4" in res.stderr and "recipes/bar.yaml:" in res.stderr


def test_the_project_files_problems_come_at_once_with_a_did_you_mean(tmp_path: Path) -> None:
    """`defaults:` typos got no did-you-mean, and a top-level typo hid them (two rounds)."""
    (tmp_path / "wheelforge.yaml").write_text(
        "default: {}\ndefaults:\n  archs: '9.0'\n  gib-per-jobs: 3\n  torch: numpy\n")
    res = wf("doctor", "--config", tmp_path / "wheelforge.yaml", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    for line in ("wheelforge.yaml: default: unknown key; did you mean 'defaults'?",
                 "wheelforge.yaml: defaults.archs: unknown key; did you mean 'arch'?",
                 "wheelforge.yaml: defaults.gib-per-jobs: unknown key; did you mean "
                 "'gib-per-job'?",
                 "wheelforge.yaml: defaults.torch: 'numpy' is not a torch requirement"):
        assert line in res.stderr, res.stderr
    assert "has 4 problem(s)" in res.stderr and "Traceback" not in res.stderr


# ------------------------------------------------------------ 7. an interrupted night

def _night(tmp_path: Path, names: list[str]) -> tuple[Path, RecipeBook, nightly.Settings]:
    root = tmp_path / "night"
    for name in names:
        src = root / "src" / name
        (src / name.replace("-", "_")).mkdir(parents=True)
        (src / name.replace("-", "_") / "__init__.py").write_text("")
        _, sha = make_sdist(src, root / "sdists", name, "0.1.0")
        write_recipe(root, name, pure_recipe(name, sha))
    (root / "wheelforge.yaml").write_text(yaml.safe_dump({"matrix": {
        "recipes": names, "python": [sys.executable],
        "torch": [{"spec": "torch==2.14.1", "cuda": "13.0"}], "archs": ["12.0"]}}))
    book = RecipeBook(root / "recipes", root / "patches")
    settings = nightly.Settings(index_dir=root / "index", cache_dir=root / "cache",
                                work_dir=root / "work", project_file=root / "wheelforge.yaml",
                                stack_check=False)
    return root, book, settings


def _stopped_after(seconds: float, logs: Path, slow: str) -> object:
    """A builder that publishes a made-up wheel, except for ``slow``: it compiles for
    ``seconds`` into its log, then Ctrl-C stops it (the log attached, as the pipeline's)."""
    def build(recipe: Recipe, config: BuildConfig, reporter: Reporter) -> pipeline.BuildResult:
        log = logs / f"{recipe.name}-0.1.0-20261201T000000.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"compiling {recipe.name}\n")
        if recipe.name == slow:
            from wheelforge.errors import attach_log  # here: the old code has none

            time.sleep(seconds)
            stop = KeyboardInterrupt()
            attach_log(stop, str(log))
            raise stop
        key = identity.build_key(recipe, config, {"python": "py3"})
        wheel = make_wheel(config.work_dir / "dist", {"ok/__init__.py": ""}, name=recipe.name,
                           version="0.1.0")
        res = index.publish(config.index_dir, wheel, channel=None, cuda=None, torch=None,
                            archs=(), build_key=key)
        return pipeline.BuildResult(recipe, res.path, (), None, key, log=log)
    return build


@pytest.mark.parametrize("together", [False, True])
def test_an_interrupted_cell_says_how_long_it_ran_and_links_its_log(
        tmp_path: Path, together: bool) -> None:
    """The report said "not run, 0.0 s" for cells that had compiled for 27 and 47 s, with
    no log link."""
    root, book, settings = _night(tmp_path, ["aaa-ok", "bbb-slow"])
    with pytest.raises(KeyboardInterrupt):
        nightly.run(load_matrix(root / "wheelforge.yaml", book.names()), book, settings,
                    reporter=Reporter(io.StringIO()), together=together,
                    build=_stopped_after(1.2, root / "logs", "bbb-slow"))  # type: ignore[arg-type]
    reports = settings.index_dir / "reports"
    data = json.loads((reports / "nightly-latest.json").read_text())
    cells = {c["recipe"]: c for c in data["cells"]}
    slow = cells["bbb-slow"]
    assert slow["status"] == "interrupted" and slow["duration_s"] >= 1.2, slow
    assert slow["note"] == "interrupted after 1 s"
    assert slow["log_file"] == "logs/bbb-slow-0.1.0-20261201T000000.log"
    assert (reports / slow["log_file"]).read_text() == "compiling bbb-slow\n"
    assert data["summary"]["interrupted"] == 1 and data["interrupted"] is True
    page = (reports / "nightly-latest.html").read_text()
    assert '<span class="interrupted">interrupted after 1 s</span>' in page
    assert 'href="logs/bbb-slow-0.1.0-20261201T000000.log"' in page
    assert "not run" not in page


# --------------------------------------------------------- 9. the pages in headless Chromium

@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium", "/usr/bin/chromium")


def test_the_contrast_function() -> None:
    assert round(contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)"), 1) == 21.0
    assert round(contrast("rgb(17, 99, 41)", "rgb(22, 22, 22)"), 1) == 2.4  # the old dark ok


def _illegible(chromium: str, page: Path, profile: Path, dark: bool) -> list[str]:
    found = probe(chromium, page, profile, COLOURS, dark=dark)
    assert isinstance(found, list) and found
    return [f"{x['what']}: {contrast(x['fg'], x['bg']):.1f}:1 ({x['fg']} on {x['bg']})"
            for x in found if contrast(x["fg"], x["bg"]) < 4.5]


@pytest.fixture(scope="module")
def stack_page(local: Path) -> Path:
    """The landing page with a good, a broken and an unchecked stack."""
    index.record_stack(local, StackStatus(channel="cu130-torch2.14", state="good",
                                          checked_at="2026-12-01T00:00:00Z"))
    index.record_stack(local, StackStatus(channel=None, state="broken",
                                          checked_at="2026-12-01T00:00:00Z",
                                          reason="wf-demo: ImportError"))
    return local / "index.html"


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_landing_pages_text_is_legible(chromium: str, stack_page: Path, tmp_path: Path,
                                           dark: bool) -> None:
    """The dark-mode stack-check text was 2.4:1; WCAG AA asks 4.5:1 of body text."""
    assert 'class="ok"' in stack_page.read_text() and 'class="bad"' in stack_page.read_text()
    assert not _illegible(chromium, stack_page, tmp_path / "profile", dark)


@pytest.fixture(scope="module")
def night_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report with a built cell whose wheel name is long, an interrupted and a
    failed one, and one not run."""
    tmp = tmp_path_factory.mktemp("report")
    results = []
    for status, wheel in [("built", "causal_conv1d-1.7.0+cu130torch2.14sm100sm120-cp311-"
                                    "cp311-manylinux_2_28_x86_64.whl"),
                          ("interrupted", None), ("failed", None), ("not run", None),
                          ("skipped", None)]:
        results.append(nightly.CellResult(
            recipe="causal-conv1d", version="1.7.0", python=sys.executable,
            torch="torch==2.14.1", cuda="13.0", pip_args=(), archs="10.0;12.0",
            status=status, wheel=wheel, duration_s=27.0, build_key="k" * 64,  # type: ignore[arg-type]
            note="interrupted after 27 s" if status == "interrupted" else "",
            error="boom" if status == "failed" else None))
    report = nightly.NightlyReport(started="2026-12-01T00:00:00Z",
                                   finished="2026-12-01T00:01:00Z", duration_s=60.0,
                                   config="wheelforge.yaml", index=str(tmp / "index"),
                                   results=tuple(results), interrupted=True)
    nightly.write_report(report, tmp / "index" / "reports")
    return tmp / "index" / "reports" / "nightly-latest.html"


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_nightly_reports_text_is_legible(chromium: str, night_page: Path, tmp_path: Path,
                                             dark: bool) -> None:
    assert not _illegible(chromium, night_page, tmp_path / "profile", dark)


@pytest.mark.parametrize("width", [700, 1000])
def test_the_report_breaks_wheel_names_only_between_their_parts(
        chromium: str, night_page: Path, tmp_path: Path, width: int) -> None:
    """The report broke wheel names mid-word (`causal_conv1d-1.7.0+cu130torch2.14s` /
    `m120-...`)."""
    (lines,) = probe(chromium, night_page, tmp_path / "profile",  # type: ignore[misc]
                     LINES % "\"td a[href$='.whl']\"", width=width)
    assert "".join(lines).startswith("causal_conv1d-1.7.0+")
    assert len(lines) > 1, lines  # narrow enough to wrap
    assert all(line[-1] in "-+_" for line in lines[:-1]), lines


@pytest.mark.parametrize("width", [700, 1000])
def test_the_report_breaks_a_torch_requirement_only_after_its_operator(
        chromium: str, night_page: Path, tmp_path: Path, width: int) -> None:
    """A second newcomer day: at 1000 px the Torch column read `torch=` / `=2.14.` /
    `1`."""
    found = probe(chromium, night_page, tmp_path / "profile",
                  LINES % "'td:nth-child(4) code'", width=width)
    assert isinstance(found, list) and found, found
    for lines in found:
        assert "".join(lines) == "torch==2.14.1", lines
        assert lines in (["torch==2.14.1"], ["torch==", "2.14.1"]), lines


def test_the_nightly_doc_counts_the_shipped_matrix_and_names_the_interrupted_exit_code(
        ) -> None:
    """docs/nightly.md said the shipped matrix is 4 cells (it is 6) and that an
    interrupted run exits 1 (it exits 130)."""
    from wheelforge.recipe.matrix import cells

    book = RecipeBook(REPO / "recipes", REPO / "patches")
    matrix = load_matrix(REPO / "wheelforge.yaml", book.names())
    shipped = cells(matrix, {n: book.load(n).build.cell_kind for n in book.names()})
    doc = (REPO / "docs" / "nightly.md").read_text()
    said = re.search(r"The shipped matrix is (\d+) cells", doc)
    assert said and int(said.group(1)) == len(shipped), [c.label for c in shipped]
    assert "130 for Ctrl-C" in doc and "or the run was interrupted" not in doc


def test_the_readme_names_what_the_tests_need_besides_python() -> None:
    """45+ tests skip without chromium, nginx and redis, which the set-up never said."""
    setup = (REPO / "README.md").read_text().split("## Install the stack")[0]
    for tool in ("chromium", "nginx", "redis-server", ".ci/run"):
        assert tool in setup, tool
