"""A newcomer's first hour (issue 17): what a new user types, with only the README and
--help, is either understood or refused with a message that says what to do; never a
silent acceptance of a typo, a traceback or a misleading word.  Real processes: the CLI
as users run it, each case asserting its message and exit code."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest

from cli_inprocess import Ran, run_wheelforge
from conftest import REPO, make_wheel, write_recipe
from wheelforge.cli.main import cli
from wheelforge.errors import ConfigError, exit_code_markdown, exit_code_table
from wheelforge.recipe.format import RecipeBook


def wf(*args: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> Ran:
    """The command in this process (tests/cli_inprocess.py): these tests check its text and
    exit status; the caller's arch list, recipes and job count are not the command's."""
    unset: dict[str, str | None] = {k: None for k in ("TORCH_CUDA_ARCH_LIST",
                                                       "WHEELFORGE_RECIPES", "MAX_JOBS")}
    return run_wheelforge(*args, cwd=cwd, env={**unset, **(env or {})})


def wf_process(*args: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """The command as a process of its own: for a real build."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("TORCH_CUDA_ARCH_LIST", "WHEELFORGE_RECIPES", "MAX_JOBS")}
    return subprocess.run([sys.executable, "-m", "wheelforge", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})})


def empty_index(root: Path) -> Path:
    (root / "files").mkdir(parents=True)
    return root


# -- 1. interpreters and toolkits as users name them -------------------------------------------

def test_python_as_a_bare_name_is_looked_up_on_path(tmp_path: Path) -> None:
    """`--python python3`, as uv accepts it: found on PATH and the resolved path printed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    res = wf("doctor", "--python", "python3", cwd=tmp_path, env={"PATH": path})
    assert res.stdout.splitlines()[0] == f"python: {bin_dir / 'python3'} [--python python3]"
    assert "is not an executable Python interpreter" not in res.stdout
    assert "./python3" not in res.stdout


def test_the_build_summary_names_the_interpreter_a_bare_name_resolved_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wheelforge.builder.config import resolve

    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3.11").symlink_to(sys.executable)
    cfg = resolve(python=Path("python3.11"), environ={"PATH": str(bin_dir)})
    assert cfg.python == bin_dir / "python3.11"
    assert cfg.summary()[1] == (f"build env      {bin_dir / 'python3.11'} (as-is)  "
                                "[--python python3.11]")
    given = resolve(python=Path("./bin/python3.11"), environ={"PATH": ""})
    assert given.python == bin_dir / "python3.11"  # a path is a path, PATH not consulted
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert resolve(python=venv).python == venv / "bin" / "python"  # a venv, as uv takes it
    with pytest.raises(ConfigError) as exc:
        resolve(python=tmp_path / "bin")
    assert exc.value.what == f"--python {tmp_path / 'bin'} is a directory without bin/python"


def test_a_dot_slash_path_is_a_path_not_a_name(tmp_path: Path) -> None:
    """`--python ./python3` is the file here (click must not normalize the './' away), and
    `--python python3` the one on PATH, even with a ./python3 beside."""
    (tmp_path / "python3").symlink_to(sys.executable)
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{on_path}{os.pathsep}{os.environ['PATH']}"}
    here = wf("doctor", "--python", "./python3", cwd=tmp_path, env=env)
    assert here.stdout.splitlines()[0] == f"python: {tmp_path / 'python3'} [--python ./python3]"
    named = wf("doctor", "--python", "python3", cwd=tmp_path, env=env)
    assert named.stdout.splitlines()[0] == f"python: {on_path / 'python3'} [--python python3]"


def test_python_name_not_on_path_says_so(tmp_path: Path) -> None:
    res = wf("build", "causal-conv1d", "--python", "python9.9", "--index", tmp_path / "i")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[:2] == [
        "config error: --python python9.9: no 'python9.9' on PATH",
        "  why: a name without a '/' is looked up on PATH, as uv does",
    ]
    assert not (tmp_path / "i").exists()


def test_a_cuda_home_that_is_no_toolkit_is_a_doctor_fail_naming_it(tmp_path: Path) -> None:
    res = wf("doctor", cwd=tmp_path, env={"CUDA_HOME": "/nonexistent"})
    assert res.returncode == 6
    first = res.stdout.splitlines()[0]
    assert first.startswith("FAIL  nvcc         CUDA_HOME=/nonexistent is not a CUDA toolkit: "
                            "/nonexistent does not exist")
    assert "point CUDA_HOME at a toolkit" in first
    assert re.search(r"^toolchain error: \d+ check\(s\) failed$", res.stderr, re.M)


def test_doctor_never_says_ok_for_a_check_it_did_not_run(tmp_path: Path) -> None:
    """Without --python the torch line says what the managed environment has or will have;
    whatever the machine, no 'OK' line claims a check that did not run."""
    res = wf("doctor", "--torch", "torch>=2.10", "--cache-dir", tmp_path / "cache",
             cwd=tmp_path)
    lines = res.stdout.splitlines()
    torch = [ln for ln in lines if ln.split()[1:3] == ["torch", "the"]]
    assert torch == [("OK    torch        the managed environment (not created yet) will have "
                      "torch>=2.10")]
    cuda = [ln for ln in lines if " torch cuda " in ln]
    assert cuda and cuda[0].startswith("SKIP  torch cuda   cannot tell the CUDA of torch>=2.10")
    assert not [ln for ln in lines if ln.startswith("OK") and "not checked" in ln]


# -- 2. typos are errors ----------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["serve"], ["index", "rebuild"], ["prune"], ["yank", "demo==1.0"], ["unyank", "demo==1.0"],
    ["consumer-config"], ["test", "causal-conv1d"],
])
def test_a_path_holding_no_index_is_an_error_and_nothing_is_created(
        tmp_path: Path, command: list[str]) -> None:
    nope = tmp_path / "nope"
    recipes = ["--recipes", REPO / "recipes"] if command[0] == "test" else []
    res = wf(*command, "--index", nope, *recipes, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[:2] == [f"config error: no index at {nope}",
                                           f"  why: {nope} does not exist"]
    assert "--index" in res.stderr and "Traceback" not in res.stderr
    assert not nope.exists()


def test_an_empty_directory_is_no_index_either(tmp_path: Path) -> None:
    (tmp_path / "typo").mkdir()
    res = wf("index", "rebuild", "--index", tmp_path / "typo")
    assert res.returncode == 2
    assert res.stderr.splitlines()[:2] == [
        f"config error: no index at {tmp_path / 'typo'}",
        f"  why: {tmp_path / 'typo'} holds neither files/ nor simple/"]
    assert list((tmp_path / "typo").iterdir()) == []


def test_a_directory_inside_an_index_points_at_the_index(tmp_path: Path) -> None:
    index = empty_index(tmp_path / "index")
    (index / "simple" / "demo").mkdir(parents=True)
    for inside in (index / "files", index / "simple" / "demo"):
        res = wf("consumer-config", "--index", inside)
        assert res.returncode == 2
        assert res.stderr.splitlines()[0] == f"config error: no index at {inside}"
        assert res.stderr.splitlines()[-1] == (
            f"  fix: that is inside the index {index}: pass --index {index}")


@pytest.mark.parametrize("command", [["list"], ["check"], ["show", "causal-conv1d"]])
def test_no_recipes_directory_says_where_it_looked(tmp_path: Path, command: list[str]) -> None:
    res = wf(*command, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.splitlines() == [
        f"config error: no recipes directory at {tmp_path / 'recipes'}",
        "  why: looked there (the default, ./recipes)",
        "  fix: run wheelforge in the directory that holds recipes/, or point at one with "
        "--recipes DIR or WHEELFORGE_RECIPES=DIR",
    ]
    env = wf(*command, cwd=tmp_path, env={"WHEELFORGE_RECIPES": str(tmp_path / "r")})
    assert env.returncode == 2
    assert "  why: looked there ($WHEELFORGE_RECIPES)" in env.stderr.splitlines()


def test_an_empty_recipes_directory_is_not_zero_recipes_ok(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    res = wf("check", "--recipes", tmp_path / "recipes", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"config error: no recipes in {tmp_path / 'recipes'}\n"
                                 "  why: looked for *.yaml there (--recipes)\n")


def test_defaults_index_is_honoured_by_every_command_that_reads_an_index(
        tmp_path: Path) -> None:
    """defaults.index of wheelforge.yaml, not ./index, for serve, consumer-config, yank..."""
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  index: elsewhere\n")
    for command in (["consumer-config"], ["index", "rebuild"], ["serve"],
                    ["yank", "demo==1.0"]):
        res = wf(*command, cwd=tmp_path)
        assert res.returncode == 2
        assert res.stderr.splitlines()[0] == f"config error: no index at {tmp_path / 'elsewhere'}"
    empty_index(tmp_path / "elsewhere")
    rebuilt = wf("index", "rebuild", cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout == f"rebuilt {tmp_path / 'elsewhere'}: 0 wheel(s)\n"
    none = wf("consumer-config", cwd=tmp_path)
    assert none.returncode == 2
    assert none.stderr.startswith(
        f"config error: {tmp_path / 'elsewhere'} holds no installable wheels\n")


def test_defaults_python_and_gib_per_job_reach_doctor(tmp_path: Path) -> None:
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  python: python9.9\n")
    res = wf("doctor", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "config error: defaults.python of wheelforge.yaml python9.9: no 'python9.9' on PATH")
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  gib-per-job: 10000\n")
    res = wf("doctor", cwd=tmp_path)
    [memory] = [ln for ln in res.stdout.splitlines() if ln.split()[1:2] == ["memory"]]
    assert memory.startswith("WARN") and "below 10000 GiB" in memory
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  gib-per-job: lots\n")
    res = wf("doctor", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == "config error: wheelforge.yaml has 1 problem(s)"
    assert ("wheelforge.yaml: defaults.gib-per-job: must be a positive number of GiB, got "
            "'lots'") in res.stderr


def test_the_usage_docs_settings_table_lists_every_defaults_key() -> None:
    from wheelforge.builder.config import _DEFAULT_KEYS

    readme = (REPO / "docs" / "usage.md").read_text()
    table = readme.split("| setting | option | environment | `wheelforge.yaml` |", 1)[1]
    table = table.split("\n\n", 1)[0]
    for key in _DEFAULT_KEYS:
        assert f"`defaults.{key}`" in table, key


# -- 3. --arch as people write it ------------------------------------------------------------

@pytest.mark.parametrize(("arch", "message"), [
    ("sm_120", "config error: 'sm_120' is not a CUDA architecture; did you mean '12.0'?"),
    ("120", "config error: '120' is not a CUDA architecture; did you mean '12.0'?"),
    ("12", "config error: '12' is not a CUDA architecture; did you mean '12.0'?"),
    ("", "config error: the CUDA architecture list is empty"),
    ("13.0", "config error: 13.0 is not a known CUDA compute capability"),
    ("12.0f", "config error: '12.0f' is a family-specific target (CUDA 12.9+), which "
              "wheelforge does not build"),
])
def test_arch_as_people_write_it(tmp_path: Path, arch: str, message: str) -> None:
    for command in (["build", "causal-conv1d", "--index", str(tmp_path / "i")], ["doctor"]):
        res = wf(*command, "--arch", arch, cwd=REPO)
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines()[0] == message
        assert "Traceback" not in res.stderr and "sm_120 minimum" not in res.stderr
    assert not (tmp_path / "i").exists()


def test_arch_lists_from_the_environment_and_the_project_file(tmp_path: Path) -> None:
    res = wf("doctor", cwd=tmp_path, env={"TORCH_CUDA_ARCH_LIST": "10.0 12.0"})
    assert [ln.split()[1:3] for ln in res.stdout.splitlines() if " arch " in ln] == [
        ["arch", "10.0"], ["arch", "12.0"]]
    res = wf("doctor", cwd=tmp_path, env={"TORCH_CUDA_ARCH_LIST": "sm_120"})
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "config error: $TORCH_CUDA_ARCH_LIST: 'sm_120' is not a CUDA architecture; did you "
        "mean '12.0'?")
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  arch: ['10.0', '12.0a']\n")
    res = wf("doctor", cwd=tmp_path)
    assert [ln.split()[1:3] for ln in res.stdout.splitlines() if " arch " in ln] == [
        ["arch", "10.0"], ["arch", "12.0a"]]
    (tmp_path / "wheelforge.yaml").write_text("defaults:\n  arch: ''\n")
    res = wf("doctor", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "config error: defaults.arch of wheelforge.yaml: the CUDA architecture list is empty")


# -- 5. a clean console -----------------------------------------------------------------------

class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_line_is_cleared_before_any_other_line() -> None:
    from wheelforge._log import Reporter, clear_live

    out = FakeTty()
    reporter = Reporter(out)
    reporter.progress(1, 3)
    assert out.getvalue().endswith("[1/3] compiling, 0.0s elapsed")
    reporter.info("a line")  # the reporter's own lines clear it
    assert out.getvalue().endswith("0.0s elapsed\r\x1b[K  a line\n")
    reporter.progress(2, 3)
    clear_live()  # what the CLI does before an error, a warning or a result
    assert out.getvalue().endswith("\r\x1b[K")
    clear_live()  # once only
    assert not out.getvalue().endswith("\r\x1b[K\r\x1b[K")


def test_a_python_warning_of_wheelforge_itself_clears_the_live_line() -> None:
    import warnings

    from wheelforge._log import Reporter
    from wheelforge.cli import main as cli_module

    out = FakeTty()
    reporter = Reporter(out)
    reporter.progress(1, 2)
    saved = warnings.showwarning
    try:
        warnings.showwarning = cli_module._show_warning
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("something", UserWarning, stacklevel=1)
    finally:
        warnings.showwarning = saved
    assert out.getvalue().endswith("\r\x1b[K")


NOISY_SETUP = """import os, sys
from setuptools import setup
sys.stderr.write("/x/torch/_subclasses/functional_tensor.py:276: UserWarning: Failed to "
                 "initialize NumPy: No module named 'numpy'\\n")
sys.stderr.write("SetuptoolsDeprecationWarning: License classifiers are deprecated.\\n!!\\n"
                 "        Please consider removing the following classifiers\\n!!\\n")
if os.environ.get("NOISY_FAIL"):
    raise SystemExit("noisy: deliberate failure")
setup(name="noisy", version="0.1.0", packages=["noisy"])
"""


@pytest.mark.e2e
def test_backend_noise_goes_to_the_log_not_the_console(tmp_path: Path) -> None:
    """A real build (pure, in the shared managed environment) whose backend prints the
    banners setuptools and torch print: in the log; on the console only with -v or on
    failure."""
    from conftest import make_sdist
    from wheelforge.builder.config import default_cache_dir

    src = tmp_path / "noisy-src"
    (src / "noisy").mkdir(parents=True)
    (src / "noisy" / "__init__.py").write_text("")
    (src / "setup.py").write_text(NOISY_SETUP)
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                        'build-backend = "setuptools.build_meta"\n')
    _, sha = make_sdist(src, tmp_path / "sdists", "noisy", "0.1.0")
    write_recipe(tmp_path, "noisy", f"""format: 1
name: noisy
version: "0.1.0"
sources:
  - sdist: {{filename: noisy-0.1.0.tar.gz, sha256: "{sha}"}}
build:
  kind: pure
verify:
  imports: [noisy]
""")
    common = ["build", "noisy", "--recipes", tmp_path / "recipes", "--sources",
              tmp_path / "sdists", "--index", tmp_path / "index", "--work-dir",
              tmp_path / "work", "--cache-dir", default_cache_dir(), "--force"]
    noise = ("Failed to initialize NumPy", "License classifiers are deprecated")
    quiet = wf_process(*common, cwd=tmp_path, env={"PYTHONWARNINGS": ""})
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert not [n for n in noise if n in quiet.stderr + quiet.stdout]
    log = sorted((default_cache_dir() / "logs").glob("noisy-0.1.0-*.log"))[-1]
    assert all(n in log.read_text() for n in noise)
    verbose = wf_process(*common, "-v", cwd=tmp_path)
    assert verbose.returncode == 0 and all(n in verbose.stderr for n in noise)
    failed = wf_process(*common, cwd=tmp_path, env={"NOISY_FAIL": "1"})
    assert failed.returncode == 7
    assert "build error: the build of noisy-0.1.0 failed" in failed.stderr
    assert "noisy: deliberate failure" in failed.stderr


# -- 4. exit codes and help -------------------------------------------------------------------

def test_one_exit_code_table_in_help_and_readme() -> None:
    codes = [code for code, _ in exit_code_table()]
    assert codes == [0, 1, *range(2, 15), 70, 124, 130, 143]
    readme = (REPO / "README.md").read_text()
    assert exit_code_markdown() in readme, "regenerate the README table: " \
        "python -c 'from wheelforge.errors import exit_code_markdown as m; print(m())'"
    helped = " ".join(wf("--help").stdout.split())
    for code, meaning in exit_code_table():
        assert f"{code} {' '.join(meaning.split())}" in helped


def test_no_page_holds_a_merge_conflict_marker() -> None:
    """A merge must not leave its conflict markers in what users read (one did in the
    README for four stops)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").rglob("*.md"))]
    assert len(pages) > 10
    for page in pages:
        for line in page.read_text().splitlines():
            assert not re.match(r"(<{7}|={7}|>{7})( |$)", line), f"{page.name}: {line!r}"


def test_the_readme_counts_each_shipped_recipes_patches_as_its_recipe_lists_them() -> None:
    """The README and docs/shipped-recipes.md say how many patches each shipped recipe
    carries (`NAME` ... (N patches / N patches;): the nearest recipe named before the
    count); a recipe that gains one must not leave them behind."""
    book = RecipeBook(REPO / "recipes", REPO / "patches")
    patched = {name for name in book.names() if book.load(name).patches}
    for doc in ("README.md", "docs/shipped-recipes.md"):
        text = " ".join((REPO / doc).read_text().split())
        counted = {}
        for match in re.finditer(r"(\d+) patches", text):
            named = [n for n in re.findall(r"`([a-z0-9-]+)`", text[:match.start()])
                     if n in patched]
            assert named, (doc, text[max(0, match.start() - 80):match.end()])
            counted[named[-1]] = int(match[1])
        assert counted == {name: len(book.load(name).patches) for name in counted}, doc
        assert set(counted) == patched, doc


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        out.append((f"{prefix}{name}", command))
        if isinstance(command, click.Group):
            out += _commands(command, f"{prefix}{name} ")
    return out


def test_every_option_has_help_text() -> None:
    missing = [f"{name} {param.opts[0]}" for name, command in _commands(cli)
               for param in command.params
               if isinstance(param, click.Option) and not param.help]
    assert missing == []


@pytest.mark.parametrize("command", ["inspect", "consumer-config", "serve"])
def test_commands_have_examples(command: str) -> None:
    res = wf(command, "--help")
    assert res.returncode == 0
    examples = res.stdout.split("Examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(examples) >= 2 and all(ln.strip().split()[0] in ("wheelforge", "pip", "#")
                                      for ln in examples)


def test_inspect_prints_version_tags_torch_pin_and_size(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, {"demo/__init__.py": ""}, name="demo", version="1.0+cu130",
                       tag="cp311-cp311-linux_x86_64",
                       metadata_extra="Requires-Dist: torch==2.14.*")
    res = wf("inspect", wheel)
    assert res.returncode == 0, res.stderr
    size = wheel.stat().st_size / 1024
    assert res.stdout.splitlines() == [
        f"wheel:     {wheel.name}", "project:   demo", "version:   1.0+cu130",
        "tags:      cp311-cp311-linux_x86_64", "torch pin: torch==2.14.*",
        f"size:      {size:.1f} KiB", "shared objects: none",
        "sbom:      none (no .dist-info/sboms/wheelforge.cdx.json)"]


def test_show_names_the_source_kind_once() -> None:
    res = wf("show", "causal-conv1d")
    [source] = [ln for ln in res.stdout.splitlines() if ln.startswith("source 0:")]
    assert source.startswith("source 0:  sdist:causal_conv1d-1.7.0.tar.gz@sha256:")
    assert "sdist sdist:" not in res.stdout


def test_a_recipe_without_test_section_asked_to_test_is_a_recipe_error(tmp_path: Path) -> None:
    write_recipe(tmp_path, "notest", "format: 1\nname: notest\nversion: '1.0'\nsources:\n"
                 "  - sdist: {filename: notest-1.0.tar.gz, sha256: '" + "0" * 64 + "'}\n"
                 "build: {kind: pure}\n")
    res = wf("test", "notest", "--recipes", tmp_path / "recipes",
             "--index", empty_index(tmp_path / "index"), "--python", sys.executable,
             cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert "recipe error: recipe notest declares no GPU test" in res.stderr
    assert f"add a 'test:' section to {tmp_path / 'recipes' / 'notest.yaml'}" in res.stderr


def test_the_test_section_is_documented() -> None:
    doc = (REPO / "docs" / "recipe-format.md").read_text()
    assert "## The test section" in doc
    for key in ("source-files", "files", "requires"):
        assert f"| `{key}` |" in doc


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_normally(tmp_path: Path, sig: signal.Signals) -> None:
    """Stopping a server is its normal end: 'stopped serving', not 'interrupted', with the
    exit code of the table (130 for Ctrl-C, 143 for SIGTERM; it was 0)."""
    index = empty_index(tmp_path / "index")
    # SIGINT as at a terminal: a run started in the background by a non-interactive shell
    # (`.ci/run &`) hands its children SIGINT ignored, which Python keeps (tests/test_interrupt)
    proc = subprocess.Popen([sys.executable, "-m", "wheelforge", "serve", "--index", str(index),
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"serving {index} at http://127.0.0.1:")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name, code = ("Ctrl-C", 130) if sig == signal.SIGINT else ("SIGTERM", 143)
    assert (proc.returncode, err) == (code, f"stopped serving {index} ({name})\n")


def test_serve_on_a_missing_index_is_not_a_publish_error(tmp_path: Path) -> None:
    res = wf("serve", "--index", tmp_path / "nope", "--port", "0")
    assert res.returncode == 2
    assert "publish error" not in res.stderr
    assert res.stderr.startswith(f"config error: no index at {tmp_path / 'nope'}\n")
