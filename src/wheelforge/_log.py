"""Progress on stderr: step lines with durations and a live compile line.

On a terminal the compile progress is one line rewritten in place; elsewhere
(CI logs, pipes) a plain line is printed at most every ``interval`` seconds.
NO_COLOR is respected.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import TextIO


class Reporter:
    def __init__(self, stream: TextIO | None = None, *, interval: float = 30.0,
                 verbose: bool = False):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.color = self.tty and not os.environ.get("NO_COLOR")
        self.interval = interval
        self.verbose = verbose
        self._last_plain = 0.0
        self._live = False
        self._step_start = time.monotonic()

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _clear_live(self) -> None:
        if self._live:
            self.stream.write("\r\033[K")
            self._live = False

    def info(self, message: str) -> None:
        self._clear_live()
        self.stream.write(f"  {message}\n")
        self.stream.flush()

    def header(self, message: str) -> None:
        self._clear_live()
        self.stream.write(self._c("1", message) + "\n")
        self.stream.flush()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._clear_live()
        self.stream.write(self._c("36", "==>") + f" {name}\n")
        self.stream.flush()
        start = self._step_start = time.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            self._clear_live()
            took = time.monotonic() - start
            mark = self._c("32", "ok") if ok else self._c("31", "failed")
            self.stream.write(f"    {mark} {name} ({_fmt(took)})\n")
            self.stream.flush()

    def line(self, text: str) -> None:
        """A line of build output: shown only when verbose."""
        if self.verbose:
            self._clear_live()
            self.stream.write(f"    | {text}\n")
            self.stream.flush()

    def progress(self, done: int, total: int, what: str = "compiling") -> None:
        elapsed = _fmt(time.monotonic() - self._step_start)
        text = f"    [{done}/{total}] {what}, {elapsed} elapsed"
        if self.tty and not self.verbose:
            self.stream.write("\r\033[K" + text)
            self._live = True
            self.stream.flush()
            return
        now = time.monotonic()
        if now - self._last_plain >= self.interval or done == total:
            self._last_plain = now
            self.stream.write(text + "\n")
            self.stream.flush()

    def tick(self, what: str) -> None:
        """Periodic 'still working' line for steps without [n/m] progress."""
        now = time.monotonic()
        if now - self._last_plain >= self.interval:
            self._last_plain = now
            self.info(f"{what}, {_fmt(now - self._step_start)} elapsed")


def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
