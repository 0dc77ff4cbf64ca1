"""One error hierarchy; each class carries its exit code.

Core modules raise these; only the CLI turns them into a message and an exit
status.  Every error says what failed, why, and what to do next.
"""

from __future__ import annotations


class WheelforgeError(Exception):
    """Base class.  ``what`` failed ``why``; ``fix`` says what to do."""

    exit_code = 1
    label = "error"

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
    exit_code = 2
    label = "config error"


class RecipeError(WheelforgeError):
    exit_code = 3
    label = "recipe error"


class SourceError(WheelforgeError):
    exit_code = 4
    label = "source error"


class PatchError(WheelforgeError):
    exit_code = 5
    label = "patch error"


class ToolchainError(WheelforgeError):
    exit_code = 6
    label = "toolchain error"


class BuildError(WheelforgeError):
    exit_code = 7
    label = "build error"


class VerifyError(WheelforgeError):
    exit_code = 8
    label = "verify error"


class PublishError(WheelforgeError):
    exit_code = 9
    label = "publish error"


class NoGpuError(WheelforgeError):
    exit_code = 10
    label = "no GPU"


class GpuTestError(WheelforgeError):
    exit_code = 11
    label = "test failed"


class IncompatibleGpuError(WheelforgeError):
    exit_code = 12
    label = "incompatible GPU"


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


#: Exit statuses of interrupted runs (shell convention: 128 + signal; 124 like timeout(1)).
INTERRUPT_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143, "timeout": 124}

EXIT_CODES: dict[str, int] = {
    cls.__name__: cls.exit_code
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
    )
}
