"""One error hierarchy; each class carries its exit code.

Core modules raise these; only the CLI turns them into a message and an exit
status.  Every error says what failed, why, and what to do next.
"""

from __future__ import annotations


class WheelforgeError(Exception):
    """Base class.  ``what`` failed ``why``; ``fix`` says what to do."""

    exit_code = 1
    label = "error"
    meaning = "a nightly run with failed cells or a broken stack"

    def __init__(self, what: str, why: str = "", fix: str = "", *, log: str | None = None):
        super().__init__(what)
        self.what = what
        self.why = why
        self.fix = fix
        self.log = log

    def render(self) -> str:
        lines = [f"{self.label}: {self.what}"]
        if self.why:
            lines.append(f"  why: {self.why}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        if self.log:
            lines.append(f"  log: {self.log}")
        return "\n".join(lines)


class ConfigError(WheelforgeError):
    meaning = "configuration or usage (an option, wheelforge.yaml, no index or recipes there)"
    exit_code = 2
    label = "config error"


class RecipeError(WheelforgeError):
    meaning = "recipe (invalid, unknown, or lacking the section a command needs)"
    exit_code = 3
    label = "recipe error"


class SourceError(WheelforgeError):
    meaning = "source (download, checksum, commit or archive)"
    exit_code = 4
    label = "source error"


class PatchError(WheelforgeError):
    meaning = "patch (does not apply)"
    exit_code = 5
    label = "patch error"


class ToolchainError(WheelforgeError):
    meaning = "toolchain (nvcc, torch, compiler, build environment; a FAIL of doctor)"
    exit_code = 6
    label = "toolchain error"


class BuildError(WheelforgeError):
    meaning = "build (the compile failed)"
    exit_code = 7
    label = "build error"


class VerifyError(WheelforgeError):
    meaning = "verification (the wheel's archs, RECORD or imports)"
    exit_code = 8
    label = "verify error"


class PublishError(WheelforgeError):
    meaning = "publish (the index refused the wheel)"
    exit_code = 9
    label = "publish error"


class NoGpuError(WheelforgeError):
    meaning = "no GPU (wheelforge test)"
    exit_code = 10
    label = "no GPU"


class GpuTestError(WheelforgeError):
    meaning = "GPU test failed (wheelforge test)"
    exit_code = 11
    label = "test failed"


class IncompatibleGpuError(WheelforgeError):
    meaning = "the wheel has no code for this GPU (wheelforge test)"
    exit_code = 12
    label = "incompatible GPU"


class StackError(WheelforgeError):
    meaning = "a channel's stack is broken: its wheels, installed together, do not import"
    exit_code = 13
    label = "stack broken"


class InstallError(WheelforgeError):
    meaning = "install (pip or uv could not install the wheels into the venv)"
    exit_code = 14
    label = "install failed"
    stage = "local"  # "local": the index's own wheels; "dependencies": the rest
    unreachable = False  # an index could not be reached at all
    output = ""  # pip's or uv's output


class IndexWarning(UserWarning):
    """Something the index did on its own that its users must hear about: an interrupted
    change finished or rolled back, a file quarantined.  The CLI prints it as
    ``warning: ...`` on stderr."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or --timeout: raised in the main thread, like KeyboardInterrupt, so
    that every ``finally`` runs (child process groups stopped, locks released)."""

    def __init__(self, reason: str, exit_code: int):
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


def attach_log(exc: BaseException, log: str) -> None:
    """Name the log of the work that ``exc`` (a Ctrl-C, which has no fields) stopped, so
    that the nightly report links an interrupted cell's log."""
    exc.wheelforge_log = log  # type: ignore[attr-defined]


def attached_log(exc: BaseException) -> str | None:
    """The log :func:`attach_log` named, if any."""
    log = getattr(exc, "wheelforge_log", None)
    return log if isinstance(log, str) else None


#: Exit statuses of interrupted runs (shell convention: 128 + signal; 124 like timeout(1)).
INTERRUPT_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "timeout": 124}

#: A bug: the traceback is shown (EX_SOFTWARE of sysexits.h).
INTERNAL_ERROR_EXIT_CODE = 70

_CLASSES: dict[str, type[WheelforgeError]] = {
    cls.__name__: cls
    for cls in (
        ConfigError,
        RecipeError,
        SourceError,
        PatchError,
        ToolchainError,
        BuildError,
        VerifyError,
        PublishError,
        NoGpuError,
        GpuTestError,
        IncompatibleGpuError,
        StackError,
        InstallError,
    )
}
EXIT_CODES: dict[str, int] = {name: cls.exit_code for name, cls in _CLASSES.items()}


def exit_code_table() -> tuple[tuple[int, str], ...]:
    """Every exit status of wheelforge and what it means, in order: the one table that
    --help and the README show (tests/test_cli.py checks that the README matches)."""
    rows: list[tuple[int, str]] = [(0, "success"), (WheelforgeError.exit_code,
                                                     WheelforgeError.meaning)]
    rows += [(code, _CLASSES[name].meaning) for name, code in EXIT_CODES.items()]
    rows += [(INTERRUPT_EXIT_CODES["timeout"],
              "stopped by --timeout, or a command it ran passed its time limit"),
             (INTERRUPT_EXIT_CODES["SIGINT"], "interrupted (Ctrl-C, SIGINT)"),
             (INTERRUPT_EXIT_CODES["SIGTERM"], "terminated (SIGTERM)"),
             (INTERNAL_ERROR_EXIT_CODE, "internal error: a wheelforge bug (traceback shown)")]
    return tuple(sorted(rows))


def exit_code_markdown() -> str:
    """The table as README.md shows it."""
    lines = ["| exit code | meaning |", "|---|---|"]
    lines += [f"| {code} | {meaning} |" for code, meaning in exit_code_table()]
    return "\n".join(lines)
