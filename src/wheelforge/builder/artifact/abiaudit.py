"""The stable-ABI audit of a wheel (recipes with ``build.stable-abi``, docs/stable-abi.md).

A stable-ABI wheel may reach libtorch only through the stable C shims (``aoti_torch_*``,
``torch_*``) and the header-only ``torch::stable`` / ``torch::headeronly`` code; one
undefined ``at::``, ``c10::`` or other ``torch::`` symbol binds it to the torch it was
built against, and it fails to load (``undefined symbol``) under the next.  The symbols are
classified by torch-abi-audit (Quansight, on PyPI), the checker that knows the stable
surface and which torch introduced each shim; the undefined dynamic symbols are listed
by ``nm -uD`` through :mod:`wheelforge._proc`.
"""

from __future__ import annotations

import importlib
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from ... import _proc
from ...errors import VerifyError
from ...wheel import reading

_SHOWN = 8  # offending symbols named per shared object; the rest are counted


@dataclass(frozen=True)
class AbiAudit:
    """What the audit found: each shared object's offending symbols (empty: it keeps to
    the stable ABI) and the oldest torch whose stable shims the wheel calls."""

    unstable: tuple[tuple[str, tuple[str, ...]], ...]
    min_torch: str | None


def _checker() -> tuple[ModuleType, ModuleType]:
    """torch-abi-audit's demangler and classifier, imported when a stable-ABI wheel is
    verified (they are a dependency only where Python is 3.11 or newer)."""
    try:
        demangle = importlib.import_module("torch_abi_audit.demangle")
        torch_abi = importlib.import_module("torch_abi_audit.torch_abi")
    except ImportError:  # the dependency is missing (Python 3.10: it needs 3.11)
        raise VerifyError(
            "the stable-ABI audit needs torch-abi-audit, which is not installed",
            why="a recipe with 'build.stable-abi: true' is verified by torch-abi-audit "
                "(Python 3.11 or newer)",
            fix="install wheelforge's dependencies (pip install 'torch-abi-audit>=0.3') "
                "under Python 3.11 or newer") from None
    return demangle, torch_abi


def undefined_symbols(so: Path) -> list[str]:
    """The undefined dynamic symbols of ``so``, as ``nm -uD`` names them (mangled)."""
    nm = shutil.which("nm")
    if nm is None:
        raise VerifyError("the stable-ABI audit needs 'nm', which is not on PATH",
                          fix="install binutils")
    done = _proc.run([nm, "-u", "-D", "-j", str(so)], check=False, timeout=120)
    if done.returncode != 0:
        raise VerifyError(f"nm could not read {so.name}",
                          why=done.output.strip()[-500:], fix="check the wheel's file")
    return [line.strip() for line in done.output.splitlines() if line.strip()]


def audit_symbols(symbols: list[str]) -> tuple[tuple[str, ...], str | None]:
    """The unstable torch symbols among ``symbols`` (demangled), and the oldest torch
    whose stable shims they call."""
    demangle, torch_abi = _checker()
    verdict = torch_abi.classify_symbols([demangle.demangle_symbol(s) for s in symbols])
    floor: str | None = verdict.min_torch_version
    return tuple(str(s) for s in verdict.unstable_symbols), floor


def audit_wheel(wheel: Path) -> AbiAudit:
    """Audit every shared object of ``wheel`` (already checked by ``inspect_wheel``)."""
    unstable: list[tuple[str, tuple[str, ...]]] = []
    floors: list[Version] = []
    with tempfile.TemporaryDirectory(prefix="wheelforge-abiaudit-") as tmp, \
            reading(wheel) as zf:
        for i, name in enumerate(sorted(zf.namelist())):
            if not (name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]):
                continue
            so = Path(tmp) / f"{i}.so"
            so.write_bytes(zf.read(name))
            bad, floor = audit_symbols(undefined_symbols(so))
            unstable.append((name, bad))
            if floor:
                floors.append(Version(floor))
    return AbiAudit(unstable=tuple(unstable),
                    min_torch=str(max(floors)) if floors else None)


def torch_floor(requires: list[str]) -> Version | None:
    """The lower bound of the wheel's ``torch>=X`` requirement; None if it states none."""
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() != "torch":
            continue
        for spec in req.specifier:
            if spec.operator == ">=":
                return Version(spec.version)
    return None


def stable_abi_problems(wheel: Path, requires: list[str]) -> list[str]:
    """The audit's verdict on ``wheel`` as verification issues (empty: it keeps to the
    stable ABI and requires a torch at least as new as the shims it calls)."""
    audit = audit_wheel(wheel)
    issues = []
    if not audit.unstable:
        issues.append("a stable-ABI wheel holds no shared object to audit")
    for name, bad in audit.unstable:
        if bad:
            shown = ", ".join(bad[:_SHOWN]) + (f" and {len(bad) - _SHOWN} more"
                                               if len(bad) > _SHOWN else "")
            issues.append(f"{name} links {len(bad)} torch symbol(s) outside the stable ABI "
                          f"(it would load under the torch it was built against only): "
                          f"{shown}; port the code to torch/csrc/stable, or build it "
                          "without 'stable-abi'")
    floor = torch_floor(requires)
    if floor is None:
        issues.append("a stable-ABI wheel must require 'torch>=2.N' (Requires-Dist), the "
                      "oldest torch it loads under")
    elif audit.min_torch and _release(floor) < _release(Version(audit.min_torch)):
        issues.append(f"the wheel requires torch>={floor}, but it calls stable shims of "
                      f"torch {audit.min_torch}: raise its Requires-Dist")
    return issues


def _release(v: Version) -> tuple[int, int]:
    rel = v.release + (0, 0)
    return rel[0], rel[1]


_REQUIRES = re.compile(r"^Requires-Dist:\s*(.+?)\s*$", re.MULTILINE)


def requires_of(metadata: str) -> list[str]:
    """The Requires-Dist lines of a METADATA text."""
    return _REQUIRES.findall(metadata)
