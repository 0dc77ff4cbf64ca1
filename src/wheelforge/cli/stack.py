"""``wheelforge stack check``: a channel's wheels installed together, as users install them,
and imported together; and the gate that `build` runs after it publishes."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .._log import Reporter, clear_live
from ..errors import ConfigError, StackError
from ._options import EPILOG_SHORT, existing_index, recipes_option

if TYPE_CHECKING:
    from ..consume.stack import EarlyVenv
    from ..index.health import StackStatus

#: WHEELFORGE_STACK_CHECK=off skips the gate after a build or a nightly (said on the console);
#: =always runs it even where the channel's last passing check saw the same inputs
STACK_CHECK_VAR = "WHEELFORGE_STACK_CHECK"

deps_dir_option = click.option(
    "--deps-dir", type=click.Path(path_type=Path, file_okay=False, exists=True), default=None,
    help="Resolve the dependencies (torch, ...) from this directory of wheels only (pip "
         "--no-index --find-links), for air-gapped machines. Default: pip's configured index.")


_GATE_OFF = ("off", "0", "false", "no", "never")
_GATE_ON = ("", "on", "1", "true", "yes")


def _gate_setting(environ: Mapping[str, str] | None) -> tuple[str, str]:
    """WHEELFORGE_STACK_CHECK as set, and as read (off, on or always); a value that is none
    of them (a typo: =of, =disabled) is a ConfigError, never the check run silently."""
    value = (environ if environ is not None else os.environ).get(STACK_CHECK_VAR, "")
    word = value.strip().lower()
    if word in _GATE_OFF:
        return value, "off"
    if word in _GATE_ON or word == "always":
        return value, word if word == "always" else "on"
    import difflib

    close = difflib.get_close_matches(word, ("off", "always", "never", "on"), n=1, cutoff=0.5)
    raise ConfigError(f"{STACK_CHECK_VAR}={value!r} is not a setting of the stack check",
                      why="off (or never, 0, false, no) skips it; always checks a channel "
                          "unchanged since its last passing check too; on, or unset, checks "
                          "what changed",
                      fix=(f"did you mean {STACK_CHECK_VAR}={close[0]}? " if close else "")
                      + "set it to off, always or on, or unset it")


def gate_disabled(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the gate is off (the variable's setting), or None when it runs."""
    value, setting = _gate_setting(environ)
    return f"{STACK_CHECK_VAR}={value}" if setting == "off" else None


def gate_forced(environ: Mapping[str, str] | None = None) -> bool:
    """Whether WHEELFORGE_STACK_CHECK=always asks for the check of unchanged channels."""
    return _gate_setting(environ)[1] == "always"


def run_gate(index_dir: Path, channels: Iterable[str | None], *, python: Path,
             cache_dir: Path, recipes_dir: Path | None, deps_dir: Path | None,
             reporter: Reporter, early: EarlyVenv | None = None,
             skip_unchanged: bool = False) -> list[StackStatus]:
    """Check and record each channel's stack; print one line per channel; return the
    statuses.  Never raises for a broken stack (the caller decides).  ``early``: a venv
    made while the builds ran (its first check takes it).  ``skip_unchanged``: a channel
    whose last check passed with exactly what the check would install and import now keeps
    that status, and a line says so (``build``; ``stack check`` always checks)."""
    from ..consume import stack, stackinputs
    from ..index import health
    from ..recipe.format import RecipeBook

    book = RecipeBook(recipes_dir, recipes_dir.parent / "patches") if recipes_dir else None
    options = stack.StackOptions(python=python, work_dir=cache_dir / "stack",
                                 log_dir=cache_dir / "logs", deps_dir=deps_dir)
    out = []
    for channel in channels:
        name = channel or "simple/"
        passed = stack.unchanged(index_dir, channel, book, options) if skip_unchanged \
            else None
        if passed is not None:
            clear_live()
            click.echo(stackinputs.skip_line(passed, deps_dir))
            out.append(passed)
            continue
        with reporter.step(f"stack check of {name}: every wheel with its dependencies, "
                           "in one venv"):
            status = stack.check(index_dir, channel, book, options, say=reporter.info,
                                 early=early)
            before = stack.record(index_dir, status)
        clear_live()
        click.echo(f"stack {name}: {health.summary_line(status)}")
        moved = stack.changed_dependencies(before, status)
        if status.state == "broken" and before is not None and before.state == "good" and moved:
            click.echo(f"stack {name}: was good at {before.checked_at}; since then: "
                       + ", ".join(moved))
        out.append(status)
    return out


def early_venv_pays(index_dir: Path, *, python: Path, recipes_dir: Path | None,
                    deps_dir: Path | None) -> bool:
    """Whether ``build`` should make the check's venv while it builds: not when every
    channel of the index passed its last check with the inputs of now (a build that then
    publishes nothing skips the check, and one that publishes makes its venv then)."""
    from .. import index
    from ..consume import stack
    from ..recipe.format import RecipeBook

    try:
        known: list[str | None] = [*sorted({r.channel for r in index.load_records(index_dir)
                                            if r.channel})]
    except (OSError, ValueError):
        return True
    book = RecipeBook(recipes_dir, recipes_dir.parent / "patches") if recipes_dir else None
    options = stack.StackOptions(python=python, work_dir=index_dir, log_dir=index_dir,
                                 deps_dir=deps_dir)
    return any(stack.unchanged(index_dir, channel, book, options) is None
               for channel in known or [None])


def raise_if_broken(statuses: Sequence[StackStatus]) -> None:
    broken = [s for s in statuses if s.state == "broken"]
    if broken:
        names = ", ".join(s.channel or "simple/" for s in broken)
        raise StackError(
            f"the stack of {names} is broken: its wheels, installed together with their "
            "dependencies, do not import together",
            why=broken[0].reason,
            fix="the wheels stay published and the landing page marks the channel broken; "
                "pin or patch the culprit named above (a recipe's patches or build."
                "drop-requires), rebuild, and run wheelforge stack check again")


@click.group("stack")
def stack_group() -> None:
    """The channel's stack: its wheels installed together, as users install them."""


@stack_group.command("check", epilog=EPILOG_SHORT)
@click.option("--index", "index_dir", type=click.Path(path_type=Path, file_okay=False),
              help="The index (default: wheelforge.yaml, else ./index).")
@click.option("--channel", "channels", multiple=True,
              help="A channel to check (repeatable). Default: every channel of the index, or "
                   "the top-level simple/ when it has none.")
@click.option("--python", "python", type=click.Path(dir_okay=False),
              help="The interpreter the fresh venv is made from (default: this one's base "
                   "interpreter); its Python version must match the channel's wheels.")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Where the venv is made (and removed) and the log kept (default "
                   "$WHEELFORGE_CACHE, else ~/.cache/wheelforge).")
@deps_dir_option
@recipes_option
def stack_check(index_dir: Path | None, channels: tuple[str, ...], python: str | None,
                cache_dir: Path | None, deps_dir: Path | None, recipes: Path | None) -> None:
    """Install every project of a channel together into one fresh venv, with the
    dependencies resolved as the printed pip install resolves them (pip's dry run; uv
    writes those versions from its cache, or pip where uv cannot serve or with
    WHEELFORGE_INSTALLER=pip), then run pip check and import every recipe's modules in
    one interpreter.

    Records the result in the index (CHANNEL/stack.json, shown on the landing page) and
    prints it: good (with the dependency versions it saw), broken (the failing import and
    the package that caused it, with its requirement chain) or not checked (why: e.g. the
    dependencies could not be reached; pass --deps-dir). Exits 13 when a stack is broken.
    Always checks, also a channel that `build` and `nightly` skip as unchanged since its
    last passing check.
    """
    import sys

    from .. import index
    from ..builder.config import default_cache_dir, project_python

    target = existing_index(index_dir)
    known = sorted({r.channel for r in index.load_records(target) if r.channel is not None})
    for c in channels:
        if c not in known:
            raise ConfigError(f"{target} has no channel {c!r}",
                              why=f"its channels are: {', '.join(known) or 'none'}",
                              fix="pass one of those to --channel, or leave --channel out")
    chosen: list[str | None] = list(channels) or list(known) or [None]
    interp = project_python(python) or Path(getattr(sys, "_base_executable", sys.executable))
    recipes_dir = recipes or (Path(os.environ["WHEELFORGE_RECIPES"])
                              if os.environ.get("WHEELFORGE_RECIPES") else Path("recipes"))
    statuses = run_gate(target, chosen, python=interp, cache_dir=cache_dir or default_cache_dir(),
                        recipes_dir=recipes_dir if recipes_dir.is_dir() else None,
                        deps_dir=deps_dir, reporter=Reporter())
    raise_if_broken(statuses)
