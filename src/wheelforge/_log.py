"""Progress on stderr: step lines with durations and a live compile line.

On a terminal the compile progress is one line rewritten in place; elsewhere
(CI logs, pipes) a plain line is printed at most every ``interval`` seconds.
NO_COLOR is respected.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TextIO

#: Reporters whose live line may be on the terminal now: cleared before any other output.
_LIVE: weakref.WeakSet[Reporter] = weakref.WeakSet()


def clear_live() -> None:
    """Erase every live progress line, so that the next line printed (an error, an
    interrupt, a warning, a result on stdout) starts at the beginning of a clean line."""
    for reporter in list(_LIVE):
        with reporter._lock:
            reporter._clear_live()
            reporter.stream.flush()


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
        self._lock = threading.RLock()
        self._counts: tuple[int, int, str] = (0, 0, "")

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _clear_live(self) -> None:
        if self._live:
            self.stream.write("\r\033[K")
            self._live = False
            _LIVE.discard(self)

    def _emit(self, text: str) -> None:
        with self._lock:
            self._clear_live()
            self.stream.write(text + "\n")
            self.stream.flush()

    def info(self, message: str) -> None:
        self._emit(f"  {message}")

    def header(self, message: str) -> None:
        self._emit(self._c("1", message))

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._emit(self._c("36", "==>") + f" {name}")
        start = self._step_start = time.monotonic()
        ok = False
        stopped = False
        try:
            yield
            ok = True
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, --timeout: the step did not fail
            stopped = True
            raise
        finally:
            took = time.monotonic() - start
            mark = (self._c("32", "ok") if ok else self._c("33", "stopped") if stopped
                    else self._c("31", "failed"))
            self._emit(f"    {mark} {name} ({_fmt(took)})")

    def line(self, text: str) -> None:
        """A line of build output: shown only when verbose."""
        if self.verbose:
            self._emit(f"    | {text}")

    def progress(self, done: int, total: int, what: str = "compiling") -> None:
        with self._lock:
            self._counts = (done, total, what)
            self._show(force=done == total)

    def _show(self, force: bool = False) -> None:
        done, total, what = self._counts
        elapsed = _fmt(time.monotonic() - self._step_start)
        text = (f"    [{done}/{total}] {what}, {elapsed} elapsed" if total
                else f"    {what}, {elapsed} elapsed")
        if self.tty and not self.verbose:
            self.stream.write("\r\033[K" + text)
            self._live = True
            _LIVE.add(self)
            self.stream.flush()
            return
        now = time.monotonic()
        if force or now - self._last_plain >= self.interval:
            self._last_plain = now
            self.stream.write(text + "\n")
            self.stream.flush()

    @contextlib.contextmanager
    def heartbeat(self, what: str) -> Iterator[None]:
        """Keep the progress line alive while a long step prints nothing: refreshed every
        second on a terminal, a plain line every ``interval`` seconds elsewhere."""
        self._counts = (0, 0, what)
        self._last_plain = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(1.0 if self.tty else min(self.interval, 5.0)):
                with self._lock:
                    self._show()

        thread = threading.Thread(target=beat, name="wheelforge-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()



def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
