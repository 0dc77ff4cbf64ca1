"""``publish``, the single writer of the nightly's three parts (:mod:`.fanout` plans and
runs them): each stage's wheel is checked against its record and the plan
(:mod:`.stagecheck`), then :func:`index.publish_build` decides under the index lock: a
build key already published is skipped (a retried job is a no-op), else the build number
is chosen and the wheel is retagged with it and published.  The nightly report lists every
cell of the plan: built, skipped, failed, or not run (no stage came back).  The in-process
nightly runs and publishes each cell through the same two parts (:func:`run_and_publish`).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .. import index
from .._fs import atomic_file
from .._log import Reporter
from ..builder.artifact import identity
from ..errors import ConfigError, PublishError, WheelforgeError
from ..recipe.format import RecipeBook
from ..recipe.matrix import Cell
from ..wheel import retag
from .cells import LOGS_DIR, REPORTS_DIR, CellResult, CellStatus, NightlyReport, Settings
from .durations import record_durations
from .fanout import RECORD, Plan, PlannedCell, StageRecord, load_stage, now, run_cell
from .gate import check_night
from .report import link_from_landing_page, write_report
from .signing import Signer, verify_stage
from .stagecheck import Staged, open_in_stage, reproduced, verify_stage_wheel
from .state import CellPlan, CellRunner

__all__ = ["publish", "run_and_publish", "stage_dirs"]

def _result(c: PlannedCell, status: CellStatus, **kw: Any) -> CellResult:
    return CellResult(recipe=c.recipe, version=c.version, python=c.python or "", torch=c.torch,
                      cuda=c.cuda, pip_args=c.pip_args, archs=c.archs, status=status,
                      subset=c.cell.subset_text, build_key=c.build_key, **kw)


Loaded = tuple[Path, StageRecord, Signer]


def _load(plan: Plan, stages: Sequence[Path],
          allowed_signers: Path | None) -> dict[int, list[Loaded]]:
    """Every stage checked before anything is published (:mod:`.stagecheck`, and its
    signature: :mod:`.signing`), by cell id; the first problem raises."""
    by_id = {c.id: c for c in plan.cells}
    loaded: dict[int, list[Loaded]] = {}
    for stage in stages:
        rec = load_stage(stage)
        mine = by_id.get(rec.cell.id)
        if mine is None or mine.build_key != rec.cell.build_key:
            raise PublishError(
                f"the stage {stage} ({rec.cell.label}) is not a cell of this plan",
                why=f"plan {plan.created} has no cell {rec.cell.id} with build key "
                    f"{rec.cell.build_key[:16]}",
                fix="publish the stages of one plan with that plan")
        if rec.status == "built":
            assert rec.wheel is not None
            verify_stage_wheel(stage, rec.wheel, mine.archs, top_level=mine.top_level,
                               excluded=mine.excluded, allow=mine.allow)
        signer = verify_stage(stage, allowed_signers)
        loaded.setdefault(rec.cell.id, []).append((stage, rec, signer))
    return loaded


def publish(plan: Plan, stages: Sequence[Path], settings: Settings, *, reporter: Reporter,
            report_dir: Path | None = None, started: float | None = None,
            book: RecipeBook | None = None, require_reproduced: int | None = None,
            allowed_signers: Path | None = None) -> NightlyReport:
    """Publish the built stages of ``plan`` into ``settings.index_dir`` and write the
    nightly report (every cell of the plan; a planned cell without a stage is "not
    run").  A stage that does not belong to the plan, holds a link, whose wheel does not
    match its record or fails verification (:mod:`.stagecheck`), or whose signature does
    not verify against ``allowed_signers`` (:mod:`.signing`), is an error before anything
    is published.  ``require_reproduced`` N publishes a cell only when N builders the
    publisher trusts (distinct verified signers; an unsigned stage counts as none)
    staged byte-identical wheels (else the cell fails, naming each stage's sha256 and
    signer); it needs ``allowed_signers``."""
    if require_reproduced is not None and allowed_signers is None:
        raise ConfigError(f"--require-reproduced {require_reproduced} counts builders the "
                          "publisher trusts, and it was given no allowed-signers file",
                          why="a stage's host field is the builder's word, not proof",
                          fix="pass --allowed-signers FILE (ssh-keygen's allowed_signers "
                              "format: one `NAME KEY` line per trusted builder; "
                              "docs/trust.md)")
    t0 = time.monotonic() if started is None else started
    reports = report_dir or settings.index_dir / REPORTS_DIR
    loaded = _load(plan, stages, allowed_signers)
    results: list[CellResult] = list(plan.done)
    timed: list[tuple[Cell, float]] = []
    for c in plan.cells:
        got = loaded.get(c.id, [])
        built = [x for x in got if x[1].status == "built"]
        if not got:
            results.append(_result(c, "not run", note="no stage came back from its job"))
            continue
        if not built:
            s, r, who = got[-1]
            reporter.info(f"FAILED {c.label} on {r.host}")
            results.append(_result(c, "failed", duration_s=r.duration_s, error=r.error,
                                   log_tail=r.log_tail, note=f"on {r.host} ({who.describe()})",
                                   **_stage_log(c, s, r, reports)))
            continue
        stage, r, who = built[0]  # a retried job staged it twice: the first is published
        timed.append((c.cell, r.duration_s))
        try:
            if require_reproduced is not None:
                chosen = reproduced(c.label, [Staged(s, w.identity, str(x.sha256))
                                              for s, x, w in built], require_reproduced)
                stage, r, who = next(b for b in built if b[0] == chosen.stage)
            results.append(_publish_one(c, stage, r, settings.index_dir, reporter,
                                        _stage_log(c, stage, r, reports), who))
        except WheelforgeError as exc:
            reporter.info(f"FAILED to publish {c.label}: {exc.render()}")
            results.append(_result(c, "failed", duration_s=r.duration_s, error=exc.render(),
                                   log_tail=exc.why or exc.what, note=f"on {r.host}"))
    record_durations(settings.cache_dir, timed)
    stacks = check_night(settings, book, results, reporter)
    report = NightlyReport(
        started=plan.created or now(), finished=now(),
        duration_s=round(time.monotonic() - t0, 3), config=plan.config,
        index=str(settings.index_dir), results=tuple(results), stacks=stacks)
    write_report(report, reports)
    link_from_landing_page(settings.index_dir, reports)
    return report


def _publish_stage(c: PlannedCell, stage: Path, r: StageRecord,
                   index_dir: Path) -> index.BuildPublishResult:
    """The stage's wheel into the index, every decision under the index lock."""
    assert r.wheel is not None
    wheel = stage / r.wheel
    with tempfile.TemporaryDirectory(prefix="wf-retag-") as tmp:
        def relabeled(tag: str | None) -> Path:
            return retag(wheel, Path(tmp) / (tag or "0"), tag)

        return index.publish_build(index_dir, wheel, build_key=c.build_key, channel=r.channel,
                                   cuda=r.cuda, torch=r.torch, archs=r.archs,
                                   relabel=relabeled)


def _stage_log(c: PlannedCell, stage: Path, r: StageRecord, reports: Path) -> dict[str, str]:
    """The stage's build log copied beside the report, under a name of its cell (every
    stage's is build.log): the ``log`` and ``log_file`` of its result, or none.  Only the
    file the record names inside the stage is read (:func:`.stagecheck.open_in_stage`),
    never the builder's own path."""
    if r.log is None:
        return {}
    name = f"{c.recipe}-{c.version}-cell{c.id}-{c.build_key[:12]}.log"
    with open_in_stage(stage, "log", r.log) as src, \
            atomic_file(reports / LOGS_DIR / name) as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return {"log": str(stage / r.log), "log_file": f"{LOGS_DIR}/{name}"}


def _publish_one(c: PlannedCell, stage: Path, r: StageRecord, index_dir: Path,
                 reporter: Reporter, log: dict[str, str], who: Signer) -> CellResult:
    done = _publish_stage(c, stage, r, index_dir)
    if not done.published:
        reporter.info(f"{c.label}: already published as {done.path.name}; nothing written")
        return _result(c, "skipped", duration_s=r.duration_s, wheel=done.path.name,
                       archs_found=tuple(done.record.archs),
                       note="published already (a retried job, or another publisher)")
    reporter.info(f"{c.label}: published {done.path.name} (built on {r.host}, "
                  f"{who.describe()})")
    return _result(c, "built", duration_s=r.duration_s, wheel=done.path.name,
                   archs_found=_sass(r.archs), **log,
                   note="; ".join(x for x in (r.note, f"built on {r.host}", who.describe())
                                  if x))


def run_and_publish(state: CellRunner, plan: CellPlan) -> CellResult:
    """One cell of the in-process nightly, through the same two parts as on many
    builders: run it into a stage (:func:`run_cell`), publish the stage
    (:func:`index.publish_build` under the index lock).  The caller holds the cell's
    build-key lock."""
    assert plan.recipe is not None and plan.config is not None and plan.key is not None
    cell = plan.cell
    cuda = state.find_cuda(plan.config) if plan.recipe.build.kind == "extension" else None
    planned = PlannedCell(
        id=-1, recipe=cell.recipe, version=str(plan.recipe.version), python=cell.python,
        torch=cell.torch.spec, cuda=cell.torch.cuda, pip_args=cell.torch.pip_args,
        archs=cell.archs, build_key=plan.key,
        toolchain=identity.toolchain_identity(plan.recipe, plan.config, cuda),
        subset=cell.subset)
    root = state.settings.cache_dir / "stage"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{cell.recipe}-", dir=root) as tmp:
        stage = Path(tmp) / "stage"
        r = run_cell(planned, state.matrix, state.book, state.settings, stage,
                     reporter=state.reporter, build=state.build, share=state)
        if r.status == "failed":
            state.reporter.info(f"FAILED {cell.label}")
            return state.result(plan, "failed", error=r.error, log=r.builder_log,
                                log_tail=r.log_tail)
        done = _publish_stage(planned, stage, r, state.settings.index_dir)
    if not done.published:
        state.published[plan.key] = done.record
        return state.skipped(plan, "published by another run meanwhile")
    return state.result(plan, "built", wheel=done.path.name, archs_found=_sass(r.archs),
                        log=r.builder_log, note=r.note)


def _sass(archs: Iterable[str]) -> tuple[str, ...]:
    return tuple(a for a in archs if a.startswith("sm_"))


def stage_dirs(roots: Iterable[Path]) -> list[Path]:
    """Stage directories under ``roots``: a root holding ``cell.json`` is one itself,
    else each directory below it (at any depth) that holds one, in name order (the
    artifacts of a workflow run are downloaded into one directory each)."""
    out: list[Path] = []
    for root in roots:
        if (root / RECORD).is_file():
            out.append(root)
            continue
        if not root.is_dir():
            raise ConfigError(f"{root} is not a stage directory", fix="pass the directories "
                              "that `wheelforge nightly run --stage-dir` filled")
        out.extend(sorted(p.parent for p in root.rglob(RECORD) if ".index" not in p.parts))
    return out
