"""Name the cause of a failed build from its log.

The known failure signatures are data (``failures.yaml`` beside this module):
each has a stable id, patterns, a cause and a fix.  ``diagnose`` returns every
signature found in a log, in the table's priority order; for a failure the
table does not know, ``first_error_line`` points at the line to read first.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from ...arch import MIN_CUDA_FOR_ARCH
from ...errors import WheelforgeError

__all__ = [
    "Diagnosis",
    "Signature",
    "clean",
    "diagnose",
    "first_error_line",
    "load_signatures",
    "parse_signatures",
]

#: Memory one nvcc job may take at its peak (cicc on heavy templates); the settings
#: (builder/config.py) plan jobs with it unless a project declares or a build records more.
DEFAULT_GIB_PER_JOB = 4.0
TABLE = "failures.yaml"
FORMAT = 1
#: Placeholders a cause or fix may use besides the named groups of its patterns.
FACTS = frozenset({"jobs", "fewer_jobs", "gib_per_job", "arch", "min_cuda"})
_ALWAYS = frozenset({"gib_per_job"})
_REQUIRED = ("id", "title", "patterns", "cause", "fix")
_OPTIONAL = ("cause-fallback", "fix-fallback")
_ID = re.compile(r"^WF-D\d{3}$")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_JOBS = (
    re.compile(r"Using envvar MAX_JOBS \((\d+)\)"),
    re.compile(r"'ninja', '-v', '-j', '(\d+)'"),
    re.compile(r"\bMAX_JOBS=(\d+)"),
)


@dataclass(frozen=True)
class Signature:
    """One known failure: where any of ``patterns`` matches, ``cause`` and ``fix`` apply."""

    id: str
    title: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    cause_fallback: str | None = None
    fix_fallback: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    id: str
    title: str
    cause: str
    fix: str
    line: str  # the log line where the signature matched, stripped
    line_no: int  # 1-based


# -- the table ---------------------------------------------------------------------------------

@functools.cache
def load_signatures() -> tuple[Signature, ...]:
    """The packaged table, validated once per process."""
    text = resources.files("wheelforge.builder.compiling").joinpath(TABLE).read_text(
        encoding="utf-8")
    return parse_signatures(text, source=f"wheelforge/builder/compiling/{TABLE}")


def parse_signatures(text: str, *, source: str = TABLE) -> tuple[Signature, ...]:
    """Parse and validate a signature table; every problem is reported in one error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _table_error(source, [f"not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise _table_error(source, ["the top level must be a mapping with format and signatures"])
    problems: list[str] = []
    if data.get("format") != FORMAT:
        problems.append(f"format must be {FORMAT}, got {data.get('format')!r}")
    entries = data.get("signatures")
    if not isinstance(entries, list) or not entries:
        raise _table_error(source, [*problems, "signatures must be a non-empty list"])
    out: list[Signature] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"signatures[{index}]"
        raw_id = entry.get("id") if isinstance(entry, dict) else None
        if isinstance(raw_id, str):
            where += f" ({raw_id})"
            if raw_id in seen:
                problems.append(f"{where}: id {raw_id} is already used by "
                                f"signatures[{seen[raw_id]}]")
            else:
                seen[raw_id] = index
        sig = _parse_entry(entry, where, problems)
        if sig is not None:
            out.append(sig)
    if problems:
        raise _table_error(source, problems)
    return tuple(out)


def _parse_entry(entry: Any, where: str, problems: list[str]) -> Signature | None:
    if not isinstance(entry, dict):
        problems.append(f"{where}: must be a mapping")
        return None
    before = len(problems)
    for key in entry:
        if key not in _REQUIRED and key not in _OPTIONAL:
            near = difflib.get_close_matches(str(key), [*_REQUIRED, *_OPTIONAL], n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"{where}: unknown key {key!r}{hint}")
    for key in _REQUIRED:
        if key not in entry:
            problems.append(f"{where}: {key} is missing")
    texts: dict[str, str] = {}
    for key in ("id", "title", "cause", "fix", *_OPTIONAL):
        value = entry.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{where}: {key} must be a non-empty string")
        else:
            texts[key] = " ".join(value.split())
    if "id" in texts and not _ID.match(texts["id"]):
        problems.append(f"{where}: id {texts['id']!r} must look like WF-D001")
    patterns = _compile_patterns(entry.get("patterns"), where, problems)
    if len(problems) > before:
        return None
    known = set(FACTS)
    groups = [set(p.groupindex) for p in patterns]
    known.update(*groups)
    guaranteed = set.intersection(*groups) | _ALWAYS
    for field in ("title", "cause", "fix"):
        names = set(_PLACEHOLDER.findall(texts[field]))
        if field == "title" and names:
            problems.append(f"{where}: title must be plain text, found {{{sorted(names)[0]}}}")
            continue
        unknown = names - known
        if unknown:
            problems.append(f"{where}: {field} uses unknown placeholder(s) "
                            + ", ".join(f"{{{n}}}" for n in sorted(unknown)))
        fallback = texts.get(f"{field}-fallback")
        if names - guaranteed and fallback is None:
            problems.append(f"{where}: {field} uses "
                            + ", ".join(f"{{{n}}}" for n in sorted(names - guaranteed))
                            + f", which not every match provides; add {field}-fallback")
        if fallback is not None:
            loose = set(_PLACEHOLDER.findall(fallback)) - guaranteed
            if loose:
                names_text = ", ".join(f"{{{n}}}" for n in sorted(loose))
                problems.append(f"{where}: {field}-fallback may only use placeholders every "
                                f"match provides, not {names_text}")
    if len(problems) > before:
        return None
    return Signature(id=texts["id"], title=texts["title"], patterns=patterns,
                     cause=texts["cause"], fix=texts["fix"],
                     cause_fallback=texts.get("cause-fallback"),
                     fix_fallback=texts.get("fix-fallback"))


def _compile_patterns(value: Any, where: str, problems: list[str]) -> tuple[re.Pattern[str], ...]:
    raw = [value] if isinstance(value, str) else value
    if not isinstance(raw, list) or not raw:
        if value is not None:
            problems.append(f"{where}: patterns must be a regular expression or a non-empty list")
        return ()
    compiled: list[re.Pattern[str]] = []
    for i, pattern in enumerate(raw):
        if not isinstance(pattern, str) or not pattern:
            problems.append(f"{where}: patterns[{i}] must be a non-empty string")
            continue
        try:
            compiled.append(re.compile(pattern, re.MULTILINE))
        except re.error as exc:
            problems.append(f"{where}: patterns[{i}] is not a valid regular expression: {exc}")
    return tuple(compiled)


def _table_error(source: str, problems: list[str]) -> WheelforgeError:
    return WheelforgeError(
        f"the failure signature table {source} is invalid",
        why="; ".join(problems),
        fix="correct the entries named above (the file's header describes every key)",
    )


# -- matching ----------------------------------------------------------------------------------

def clean(log_text: str) -> str:
    """The log as it reads on a terminal: colour codes removed, newlines normalized."""
    return _ANSI.sub("", log_text).replace("\r\n", "\n").replace("\r", "\n")


def diagnose(log_text: str, *, jobs: int | None = None,
             signatures: tuple[Signature, ...] | None = None) -> list[Diagnosis]:
    """Every known failure in ``log_text``, in table order, each signature at most once.

    ``jobs`` is the build's parallel job count when the caller knows it; otherwise
    it is read from the log (torch prints MAX_JOBS and the ninja command line).
    """
    text = clean(log_text)
    table = load_signatures() if signatures is None else signatures
    facts = _log_facts(text, jobs)
    found: list[Diagnosis] = []
    for sig in table:
        match = _first_match(sig, text)
        if match is None:
            continue
        values = dict(facts)
        values.update({k: v for k, v in match.groupdict().items() if v is not None})
        values.update(_arch_facts(values.get("cc")))
        lead = len(match.group(0)) - len(match.group(0).lstrip())
        line_no, line = _line_at(text, match.start() + lead)
        found.append(Diagnosis(
            id=sig.id, title=sig.title,
            cause=_fill(sig.cause, sig.cause_fallback, values),
            fix=_fill(sig.fix, sig.fix_fallback, values),
            line=line, line_no=line_no,
        ))
    return found


def _first_match(sig: Signature, text: str) -> re.Match[str] | None:
    best: re.Match[str] | None = None
    for pattern in sig.patterns:
        m = pattern.search(text)
        if m is not None and (best is None or m.start() < best.start()):
            best = m
    return best


def _log_facts(text: str, jobs: int | None) -> dict[str, str]:
    facts = {"gib_per_job": f"{DEFAULT_GIB_PER_JOB:g}"}
    if jobs is None:
        for pattern in _JOBS:
            m = pattern.search(text)
            if m:
                jobs = int(m.group(1))
                break
    if jobs is not None and jobs >= 1:
        facts["jobs"] = str(jobs)
        if jobs >= 2:
            facts["fewer_jobs"] = str(jobs // 2)
    return facts


def _arch_facts(cc: str | None) -> dict[str, str]:
    """``cc`` "120" or "90a" -> arch "12.0" / "9.0a" and the oldest CUDA that compiles it."""
    m = re.fullmatch(r"(\d+)(\d)([af]?)", cc or "")
    if not m:
        return {}
    major, minor = int(m[1]), int(m[2])
    out = {"arch": f"{major}.{minor}{m[3]}"}
    need = MIN_CUDA_FOR_ARCH.get((major, minor))
    if need is not None:
        out["min_cuda"] = need
    return out


def _fill(template: str, fallback: str | None, values: Mapping[str, str]) -> str:
    names = _PLACEHOLDER.findall(template)
    if any(n not in values for n in names):
        template = fallback or template  # validation guarantees a fallback here
    return _PLACEHOLDER.sub(lambda m: values.get(m[1], m[0]), template)


def _line_at(text: str, pos: int) -> tuple[int, str]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text.count("\n", 0, pos) + 1, text[start:end if end >= 0 else len(text)].strip()


# -- the first error of an unknown failure -----------------------------------------------------

#: Wrapper lines that only say that something failed: used when nothing better is found.
_WEAK = re.compile(
    r"^\s*(?:error: (?:subprocess-exited-with-error|metadata-generation-failed)"
    r"|ERROR: |×\s|ninja: build stopped|make(?:\[\d+\])?: \*\*\*"
    r"|note: This error originates from a subprocess)"
)
_NINJA_FAILED = re.compile(r"^\s*FAILED: ")
_NINJA_STEP = re.compile(r"^\s*\[\d+/\d+\]\s|^\s*FAILED: |^\s*ninja: ")
_TRACEBACK = re.compile(r"^(\s*)Traceback \(most recent call last\):")
_CHAINED = re.compile(r"^\s*(?:During handling of the above exception"
                      r"|The above exception was the direct cause)")
_EXCEPTION = re.compile(r"^\s*(?:E\s+)?(?:[A-Za-z_]\w*\.)*[A-Z]\w*"
                        r"(?:Error|Exception|Exit|Interrupt)(?::|\s*$)")
_DIAGNOSTIC = re.compile(
    r"(?:^|[\s:)\]])(?:fatal )?error(?: #[\w-]+)?\s*:"  # gcc, nvcc front end, ld, setuptools
    r"|\b(?:fatal|error)\s+:"  # nvcc fatal   : ..., ptxas error   : ...
    r"|\binternal compiler error\b|died due to signal|Killed signal terminated"
    r"|(?<!\S)Killed[ \t]*$|^\s*Segmentation fault|\bundefined reference to\b|\bCMake Error\b"
)


def first_error_line(log_text: str) -> tuple[int, str] | None:
    """The 1-based number and text of the line to read first in a failed build's log.

    The first compiler, linker, ninja or Python error: for a ninja ``FAILED:`` step
    the compiler's own error inside that step; for a Python traceback its final
    exception line (following chained tracebacks), with the message joined when it
    starts on the next line.  Wrapper lines (pip's ``error: subprocess-exited-with-error``,
    ``ninja: build stopped``) count only when nothing else is found.
    """
    lines = clean(log_text).split("\n")
    weak: int | None = None
    for i, line in enumerate(lines):
        if _WEAK.search(line):
            if weak is None:
                weak = i
            continue
        if _NINJA_FAILED.search(line):
            return _result(lines, _error_in_step(lines, i))
        m = _TRACEBACK.match(line)
        if m:
            return _result(lines, _final_exception(lines, i, len(m.group(1))))
        if _DIAGNOSTIC.search(line) or _EXCEPTION.match(line):
            return _result(lines, i)
    return _result(lines, weak) if weak is not None else None


def _result(lines: list[str], i: int) -> tuple[int, str]:
    text = lines[i].strip()
    if _EXCEPTION.match(lines[i]) and text.endswith(":"):
        nxt = next((ln.strip() for ln in lines[i + 1:i + 3] if ln.strip()), "")
        text = f"{text} {nxt}".strip()
    return i + 1, text


def _error_in_step(lines: list[str], failed: int) -> int:
    """Inside the output of a failed ninja step, the compiler's first error (else the step)."""
    for j in range(failed + 2, min(len(lines), failed + 400)):
        if _NINJA_STEP.search(lines[j]):
            break
        if _DIAGNOSTIC.search(lines[j]):
            return j
    return failed


def _final_exception(lines: list[str], start: int, indent: int) -> int:
    """The exception line closing the traceback at ``start``, after any chained ones."""
    j = start + 1
    while j < len(lines):
        line = lines[j]
        if (line.strip() and _indent(line) <= indent and not _TRACEBACK.match(line)
                and not _CHAINED.match(line)):
            k = j + 1
            while k < len(lines) and lines[k].strip():  # the rest of its message
                k += 1
            while k < len(lines) and not lines[k].strip():
                k += 1
            if k < len(lines) and _CHAINED.match(lines[k]):
                j = k + 1
                continue
            return j
        j += 1
    return start


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
