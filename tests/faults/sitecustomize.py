"""Fault injection for tests/test_faults.py and scripts/fault_run.py: put this directory on
PYTHONPATH and set WF_KILL_DIR to an index directory.  Every os.fsync of a file or
directory under it and every os.replace/os.rename onto a path under it is counted; with
WF_KILL_AT=k the process SIGKILLs itself at the k-th (like kill -9: no cleanup).  The
count so far is kept in WF_KILL_COUNT (a file path) and each call is listed in
WF_KILL_TRACE, when set."""

import os
import signal
import threading

_DIR = os.environ.get("WF_KILL_DIR")
if _DIR:
    _DIR = os.path.realpath(_DIR) + os.sep
    _AT = int(os.environ.get("WF_KILL_AT") or 0)
    _COUNT = os.environ.get("WF_KILL_COUNT")
    _TRACE = os.environ.get("WF_KILL_TRACE")  # a file: one line per call, "n op path"
    _lock = threading.Lock()
    _calls = [0]
    _fsync, _replace, _rename = os.fsync, os.replace, os.rename

    def _inside(path):
        try:
            return os.path.realpath(os.fsdecode(path)).startswith(_DIR)
        except (TypeError, ValueError):
            return False

    def _tick(op, path):
        with _lock:
            _calls[0] += 1
            n = _calls[0]
            if _COUNT:
                with open(_COUNT, "w") as f:
                    f.write(str(n))
            if _TRACE:
                with open(_TRACE, "a") as f:
                    f.write(f"{n} {op} {os.fsdecode(path)[len(_DIR):]}\n")
        if n == _AT:
            os.kill(os.getpid(), signal.SIGKILL)

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        counted = path.startswith(_DIR) or path + os.sep == _DIR
        if counted:
            _tick("fsync", path + os.sep if path + os.sep == _DIR else path)
        return _fsync(fd)

    def replace(src, dst, **kw):
        if _inside(dst):
            _tick("replace", os.path.realpath(os.fsdecode(dst)))
        return _replace(src, dst, **kw)

    def rename(src, dst, **kw):
        if _inside(dst):
            _tick("rename", os.path.realpath(os.fsdecode(dst)))
        return _rename(src, dst, **kw)

    os.fsync, os.replace, os.rename = fsync, replace, rename
