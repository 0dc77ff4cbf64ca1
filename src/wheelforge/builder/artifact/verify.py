"""Check a built wheel against the recipe and the build configuration.

Every check runs and every issue is collected; one VerifyError lists them all.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ...arch import Arch, expected_ptx, expected_sass
from ...errors import VerifyError
from ...recipe.model import Recipe
from ...wheel import WheelInfo, inspect_wheel, integrity_problems, read_metadata, reading
from ..env import bytecode
from ..env.buildenv import BuildEnv
from . import content
from .abiaudit import requires_of, stable_abi_problems
from .fatbin import CudaArchs, FatbinError, cuda_archs
from .importcheck import WarmImports, cold_problems


@dataclass(frozen=True)
class Verified:
    wheel: Path
    archs: tuple[tuple[str, CudaArchs], ...]  # per shared object in the wheel

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(sorted({s for _, a in self.archs for s in a.sass}))

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(sorted({s for _, a in self.archs for s in a.ptx}))


def shared_object_archs(wheel: Path) -> list[tuple[str, CudaArchs]]:
    out = []
    with reading(wheel) as zf:
        for name in sorted(zf.namelist()):
            if name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]:
                out.append((name, cuda_archs(zf.read(name))))
    return out


def _import_problems(wheel: Path, env: BuildEnv, modules: tuple[str, ...], extension: bool,
                     log: Path | None, warm: WarmImports | None,
                     environ: Mapping[str, str] | None) -> list[str]:
    if not modules:
        return []
    with tempfile.TemporaryDirectory(prefix="wf-verify-") as tmp:
        try:
            with reading(wheel) as zf:
                zf.extractall(tmp)
            found = warm.problems(env.python, Path(tmp), modules, log) \
                if warm is not None and extension else None
            if found is None:
                found = cold_problems(env.python, Path(tmp), modules, extension, log,
                                      environ)
            return found
        finally:
            bytecode.forget(environ or os.environ, Path(tmp))


def _code_problems(wheel: Path, info: WheelInfo, extension: bool, archs: tuple[Arch, ...],
                   ) -> tuple[list[str], list[tuple[str, CudaArchs]]]:
    """The device code against the kind and the requested archs: issues, and each CUDA
    shared object's archs."""
    issues: list[str] = []
    per_so: list[tuple[str, CudaArchs]] = []
    try:
        per_so = shared_object_archs(wheel)
    except FatbinError as exc:
        issues.append(f"cannot read CUDA code from a shared object: {exc}")
    cuda_sos = [(n, a) for n, a in per_so if not a.empty]
    if not extension:
        if not info.pure:
            issues.append(f"tags {', '.join(info.tags)}: the recipe says pure, "
                          "expected py3-none-any")
        if per_so:
            issues.append(f"a pure wheel holds shared objects: {', '.join(n for n, _ in per_so)}")
    else:
        if info.pure:
            issues.append("the wheel is pure (py3-none-any) but the recipe builds a CUDA extension"
                          ": the extension was not compiled (was the CUDA build skipped?)")
        if not cuda_sos:
            issues.append("no shared object in the wheel holds CUDA code")
        want_sass, want_ptx = expected_sass(archs), expected_ptx(archs)
        for name, found in cuda_sos:
            if found.sass - want_sass:
                extra = ", ".join(sorted(found.sass - want_sass))
                issues.append(f"{name}: unrequested SASS {extra}"
                              f" (requested {', '.join(sorted(want_sass))}): the arch list was "
                              "not honoured")
            if want_sass - found.sass:
                issues.append(f"{name}: no SASS for {', '.join(sorted(want_sass - found.sass))}")
            if found.ptx - want_ptx:
                issues.append(f"{name}: unrequested PTX {', '.join(sorted(found.ptx - want_ptx))}")
            if want_ptx - found.ptx:
                issues.append(f"{name}: no PTX for {', '.join(sorted(want_ptx - found.ptx))}")
    return issues, cuda_sos


def content_problems(wheel: Path, top_level: tuple[str, ...],
                     excluded: tuple[str, ...], allow: tuple[str, ...] = ()) -> list[str]:
    """What the wheel installs (its ``NAME.data/`` schemes mapped to where they land)
    against the recipe's content rules (:mod:`.content`): its top-level modules against
    ``top_level`` (``verify.top-level``; a foreign package such as flash-attn's
    ``hopper``), its paths against ``excluded`` (``verify.excluded``), and, for every
    recipe, no ``.pth`` file, ``sitecustomize``/``usercustomize`` module or command that
    ``allow`` (``verify.allow``) does not name.  Also the publisher's check of a wheel
    built elsewhere."""
    return content.content_problems(wheel, content.ContentRules(top_level, excluded, allow))


def code_problems(wheel: Path, *, extension: bool, archs: tuple[Arch, ...]) -> list[str]:
    """The wheel's CUDA code checked as :func:`verify_wheel` checks it (SASS and PTX per
    shared object against ``archs``; a pure wheel holds no shared object): for a
    publisher that verifies a wheel built elsewhere."""
    return _code_problems(wheel, inspect_wheel(wheel), extension, archs)[0]


def verify_wheel(
    wheel: Path,
    recipe: Recipe,
    *,
    archs: tuple[Arch, ...],
    env: BuildEnv | None,
    log: Path | None = None,
    warm: WarmImports | None = None,
    environ: Mapping[str, str] | None = None,
) -> Verified:
    """Run every check; raise one VerifyError with all issues, or return what was found.
    ``warm``: the command's warm interpreters, which serve an extension's import check
    (builder/artifact/importcheck.py); without one, or when none can serve, it runs cold.
    ``environ``: the cold check's interpreter's environment (default: this process's;
    a warm interpreter has the one it was started with)."""
    issues: list[str] = []
    info = inspect_wheel(wheel)  # VerifyError naming every malformed or unsafe member
    if canonicalize_name(info.name) != recipe.project_name:
        issues.append(f"project name is {info.name!r}, the recipe builds "
                      f"{recipe.project_name!r}")
    if info.version.public != str(recipe.version):
        issues.append(f"version is {info.version}, the recipe pins {recipe.version}")
    issues.extend(integrity_problems(wheel))  # RECORD, WHEEL tags, METADATA, no *.libs

    found, cuda_sos = _code_problems(wheel, info, recipe.build.kind == "extension", archs)
    issues.extend(found)
    issues.extend(content_problems(wheel, recipe.verify.top_level, recipe.verify.excluded,
                                   recipe.verify.allow))
    if recipe.build.stable_abi:  # torch-abi-audit over every shared object
        issues.extend(stable_abi_problems(wheel, requires_of(read_metadata(wheel).decode())))

    if env is not None and not issues:
        issues.extend(_import_problems(wheel, env, recipe.verify.imports,
                                       recipe.build.kind == "extension", log, warm,
                                       environ))
    if issues:
        raise VerifyError(
            f"{wheel.name} failed verification ({len(issues)} issue(s)); nothing was published",
            why="\n    " + "\n    ".join(issues),
            fix="read the issues above and the build log; a patch may have stopped applying "
                "its fix, or the build environment differs from the recipe's expectations",
            log=str(log) if log else None,
        )
    return Verified(wheel, tuple(cuda_sos))
