"""Progress on stderr: step lines with durations and live compile lines.

On a terminal each running build has one live line, rewritten in place at the bottom
(a command that builds several recipes at once shows one line per running build);
elsewhere (CI logs, pipes) a plain line is printed at most every ``interval`` seconds.
A build's :meth:`Reporter.view` prefixes its lines with the recipe's name.  NO_COLOR is
respected.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TextIO

#: Screens whose live lines may be on the terminal now: cleared before any other output.
_LIVE: weakref.WeakSet[_Screen] = weakref.WeakSet()


def clear_live() -> None:
    """Erase every live progress line, so that the next line printed (an error, an
    interrupt, a warning, a result on stdout) starts at the beginning of a clean line."""
    for screen in list(_LIVE):
        with screen.lock:
            screen.clear()
            screen.stream.flush()


class _Screen:
    """One stream and its live lines (one per reporter view that has one), shared by a
    reporter and its views; drawn below everything else on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.lock = threading.RLock()
        self.lines: dict[int, str] = {}  # id(view) -> its live text, in start order
        self.drawn = 0  # how many live lines are on the terminal now

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\033[K" + "\033[1A\033[K" * (self.drawn - 1))
            self.drawn = 0
            _LIVE.discard(self)

    def draw(self) -> None:
        self.clear()
        if not self.lines:
            return
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        self.stream.write("\n".join(t[:width] for t in self.lines.values()))
        self.drawn = len(self.lines)
        _LIVE.add(self)
        self.stream.flush()


class Reporter:
    def __init__(self, stream: TextIO | None = None, *, interval: float = 30.0,
                 verbose: bool = False, _screen: _Screen | None = None, _prefix: str = ""):
        self._screen = _screen or _Screen(stream or sys.stderr)
        self.stream = self._screen.stream
        self.tty = self._screen.tty
        self.color = self.tty and not os.environ.get("NO_COLOR")
        self.interval = interval
        self.verbose = verbose
        self.prefix = _prefix
        self._last_plain = 0.0
        self._step_start = time.monotonic()
        self._lock = self._screen.lock
        self._counts: tuple[int, int, str] = (0, 0, "")

    def view(self, name: str) -> Reporter:
        """A reporter for one of several builds running at once: its lines start with
        ``[name]``, and its live line is one of the screen's."""
        return Reporter(interval=self.interval, verbose=self.verbose, _screen=self._screen,
                        _prefix=f"{self.prefix}[{name}] ")

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _emit(self, text: str) -> None:
        with self._lock:
            self._screen.clear()
            self.stream.write(self.prefix + text + "\n")
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
        if self.prefix:
            text = f"{self.prefix.strip()} {text.strip()}"
        if self.tty and not self.verbose:
            self._screen.lines[id(self)] = text
            self._screen.draw()
            return
        now = time.monotonic()
        if force or now - self._last_plain >= self.interval:
            self._last_plain = now
            self.stream.write(text + "\n")
            self.stream.flush()

    def done(self) -> None:
        """This view's build has ended: its live line goes."""
        with self._lock:
            if self._screen.lines.pop(id(self), None) is not None and self.tty:
                self._screen.draw()

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
            self.done()


def _fmt(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"
