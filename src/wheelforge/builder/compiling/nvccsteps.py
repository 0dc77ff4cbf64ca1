"""One CUDA unit's nvcc steps, with the host compile beside ptxas.

nvcc compiles a ``.cu`` unit in steps, one after another: host preprocessing, cudafe++,
device preprocessing, cicc (which also writes the host stub), ptxas, fatbinary, and last
the host compile of cudafe++'s output, which includes the fatbin as assembler data.  The
units a build's ninja runs last spend that host compile (2-5 s of each of mamba-ssm's
units) on one core while the cores the other units left stand idle (docs/performance.md,
"the host compile beside ptxas").

Opt-in: a build puts it in front of nvcc only with ``WHEELFORGE_NVCC_STEPS=1``
(builder/compiling/jobserver.py's ``runs_steps``); by default nvcc runs its own steps.  It
depends on nvcc's undocumented ``--dryrun`` output and on the text fatbinary writes, so each
toolkit is a new risk for it, and side by side it gained 1.00-1.06x in wall time on 16
cores and nothing on 2 (docs/performance.md).

This script runs in front of nvcc (``python -I -S nvccsteps.py NVCC ARGS...``: the gate's
command, or ccache's ``CCACHE_PREFIX``, through a launcher that builder/compiling/jobserver.py's
``steps_in_front`` writes; stdlib only).  It runs nvcc's own steps, as
``nvcc --dryrun`` lists them, with one change: once cicc has ended, the host compile runs
beside ptxas and fatbinary on a token of the pool's jobserver, against a placeholder
fatbin (one zero quad in the ``.nv_fatbin`` section); ``objcopy --update-section`` then
puts the fatbin that fatbinary wrote into that section.  Without a token before
fatbinary ends, the host compile runs after it, on the unit's own slot, as nvcc runs it.

Checked on every unit: the ``.c`` file fatbinary writes for the host compile (written
aside) has the placeholder's text but for the data and its length, and the object's
``.nv_fatbin`` section is then the fatbin, byte for byte (padded to 8).  If either check
fails, the host compile runs again with fatbinary's own file, as nvcc runs it, and the
launcher's directory marks that nvcc: its next units run nvcc as given.
``-MD -MF FILE`` (torch's ninja file asks for it) is nvcc's own step, no program: the
file lists what the device preprocessing read, which this script writes the same way
(tested against nvcc's, byte for byte).  The object differs from nvcc's only in the
order of its section names (objcopy writes its ``.shstrtab`` anew); the linked
extension is nvcc's, byte for byte (tests/test_nvcc_steps.py).

nvcc runs as given for anything else: no jobserver in ``MAKEFLAGS``, not a ``-c`` of
one unit with one ``-o``, preprocessing, dependency output other than ``-MD -MF``,
``--threads`` over 1, relocatable device code, steps other than the expected ones, no objcopy,
or a command that is not nvcc (ccache's prefix also comes before the host C++ compiler).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading

#: Arguments after which nvcc runs as given (nvcc's own parallel or non-compile modes).
PLAIN = frozenset({
    "-E", "--preprocess", "-M", "-MM", "-MMD", "-MT", "-MQ", "-MP",
    "--generate-dependencies", "--generate-nonsystem-dependencies",
    "--generate-nonsystem-dependencies-with-compile", "--dependency-target-name",
    "--dependency-output", "--generate-dependency-targets",
    "-dc", "--device-c", "-rdc=true", "--relocatable-device-code=true",
    "-dlink", "--device-link", "-cuda", "--cuda", "-ptx", "--ptx", "-cubin", "--cubin",
    "-fatbin", "--fatbin", "--dryrun", "-dryrun", "--keep", "-keep", "--time", "-time",
    "-V", "--version", "--help", "-h",
})
#: The steps nvcc's dry run must list for the host compile to move: up to the last cicc
#: (run in nvcc's order: the preprocessing for the host and the device, ``-MD``'s
#: dependency file, cudafe++, cicc and ptxas of each architecture), then that last
#: cicc's ptxas, fatbinary, the host compile and the removal of the intermediate files.
PATTERN = re.compile(r"((hostpre|devpre|deps|cudafe\+\+|cicc|ptxas) )*cicc (ptxas )?"
                     r"fatbinary hostcc( rm)*")
#: nvcc's own step for ``-MD -MF FILE`` (it spawns nothing: nvcc writes the file itself).
DEPS_STEP = "-- Filter Dependencies -- > "
#: A file to which each unit appends how it was compiled (tests, bench/build_speed.py):
#: ``beside`` (the host compile beside ptxas, the placeholder checked), ``after`` (no
#: token came before fatbinary ended), ``again`` (a check failed: compiled again against
#: fatbinary's own file) or ``plain`` (nvcc as given), then the object's path.
REPORT_ENV = "WHEELFORGE_NVCC_STEPS_REPORT"
#: The launcher's directory (builder/compiling/jobserver.py's :func:`steps_in_front` writes the
#: launcher), where a toolchain whose fatbin file is not the placeholder's is marked
#: (:func:`differs`): its units then run nvcc as given, not twice their host compile.
STATE_ENV = "WHEELFORGE_NVCC_STEPS_STATE"
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_CC = frozenset({"gcc", "g++", "cc", "c++", "clang", "clang++"})

#: The ``.c`` file the host compile includes for the fatbin (fatbinary's
#: ``--embedded-fatbin``, CUDA 12-13): @DATA@ is a ``.quad`` line per 32 bytes.
_FATBIN_C = '''\
#ifndef __SKIP_INTERNAL_FATBINARY_HEADERS
#include "fatbinary_section.h"
#endif
#define __CUDAFATBINSECTION  ".nvFatBinSegment"
#define __CUDAFATBINDATASECTION  ".nv_fatbin"
asm(
".section .nv_fatbin, \\"a\\"\\n"
".align 8\\n"
"fatbinData:\\n"
@DATA@".text\\n");
#ifdef __cplusplus
extern "C" {
#endif
extern const unsigned long long fatbinData[@LENGTH@];
#ifdef __cplusplus
}
#endif
#ifdef __cplusplus
extern "C" {
#endif
static const __fatBinC_Wrapper_t __fatDeviceText __attribute__ ((aligned (8))) \
__attribute__ ((section (__CUDAFATBINSECTION)))= \n\
\t{ 0x466243b1, 1, fatbinData, 0 };
#ifdef __cplusplus
}
#endif
'''
PLACEHOLDER = _FATBIN_C.replace("@DATA@", '".quad 0x0000000000000000\\n"\n').replace(
    "@LENGTH@", "1")


def placeholder_matches(text: str) -> bool:
    """Whether fatbinary's ``.c`` file ``text`` is the placeholder but for its data and
    its length: the host compile against the placeholder is the one against it."""
    head, tail = _FATBIN_C.split("@DATA@")
    start = text.find('".quad ')
    end = text.rfind('".text\\n");\n')
    if start < 0 or end < start:
        return False
    rest = re.sub(r"fatbinData\[\d+\]", "fatbinData[@LENGTH@]", text[end:], count=1)
    return text[:start] == head and rest == tail


def tool_of(command: str) -> str:
    """A step's kind: hostpre, devpre, hostcc (the host compiler preprocessing for the
    host or the device, or compiling), or the program's name (cudafe++, cicc, ptxas,
    fatbinary, rm...)."""
    if command.startswith(DEPS_STEP):
        return "deps"
    try:
        words = shlex.split(command)
    except ValueError:  # a quote left open (nvcc's rm steps do not quote their paths)
        return "unreadable"  # not a plan's step: nvcc runs as given
    if not words:
        return ""
    name = os.path.basename(words[0])
    if name in _CC:
        if "-E" in words:
            return "devpre" if any(w.startswith("-D__CUDA_ARCH__=") for w in words) \
                else "hostpre"
        return "hostcc" if "-c" in words else name
    return name


class Plan:
    """nvcc's dry run read: the environment it sets and its steps, with their kinds."""

    def __init__(self, text: str) -> None:
        self.assigns: dict[str, str] = {}
        self.steps: list[str] = []
        self.other: list[str] = []  # nvcc's own messages (warnings): printed as it would
        for line in text.splitlines():
            if not line.startswith("#$ "):
                self.other.append(line)
                continue
            body = line[3:].rstrip()
            match = _ASSIGN.match(body)
            if match and not self.steps:
                try:
                    words = shlex.split(match.group(2))
                except ValueError:  # a quote left open: the plan is not used
                    self.steps.append(body)
                    continue
                self.assigns[match.group(1)] = (words[0] if len(words) == 1 else
                                                "" if not words else match.group(2).strip())
            else:
                self.steps.append(body)
        self.kinds = [tool_of(s) for s in self.steps]

    def usable(self) -> bool:
        """Whether the host compile can move: nvcc 13's steps for one unit, the host
        stub's (cudafe++) before the last cicc, and ``-MD``'s file from one device
        preprocessing (the one it is read from)."""
        return (bool(PATTERN.fullmatch(" ".join(self.kinds)))
                and "hostpre" in self.kinds and "cudafe++" in self.kinds
                and self.kinds.count("deps") <= 1
                and ("deps" not in self.kinds or self.kinds.count("devpre") == 1))

    def index(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]


def jobserver_fifo(makeflags: str) -> str | None:
    """The named pipe of GNU make's jobserver in ``MAKEFLAGS`` (the pool's), or None."""
    match = re.search(r"--jobserver-auth=fifo:(\S+)", makeflags)
    return match.group(1) if match else None


def take_token(fifo: str, given_up: threading.Event) -> bytes | None:
    """A token of the jobserver, or None once ``given_up`` is set (the unit's own slot is
    free by then: its fatbinary ended)."""
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # the pool has gone: the unit's own slot, after fatbinary
        return None
    try:
        while not given_up.is_set():
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    token = os.read(fd, 1)
                except BlockingIOError:  # another client took it first
                    continue
                if token:
                    return token
                given_up.wait(0.05)  # no writer: nothing to take
        return None
    finally:
        os.close(fd)


def give_token(fifo: str, token: bytes) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # the pool has gone, and its slots with it
        return
    try:
        os.write(fd, token)
    finally:
        os.close(fd)


def output_of(command: str) -> str | None:
    """The file a step writes with ``-o``."""
    words = shlex.split(command)
    return words[words.index("-o") + 1] if "-o" in words[:-1] else None


def write_deps(preprocessed: str, target: str, path: str) -> None:
    """``-MD``'s dependency file, as nvcc writes it: ``target`` depends on every file the
    device preprocessing read (its line markers: the source first, then each header
    where it first appears; not gcc's ``<built-in>`` and ``<command-line>``)."""
    with open(preprocessed, "rb") as f:
        names = re.findall(rb'^# \d+ "([^"]*)"', f.read(), re.MULTILINE)
    files = list(dict.fromkeys(n.decode() for n in names if not n.startswith(b"<")))
    lines = [f"{target} : {files[0]}", *(f"    {name}" for name in files[1:])]
    part = f"{path}.{os.getpid()}.part"
    with open(part, "w") as f:
        f.write(" \\\n".join(lines) + "\n")
    os.replace(part, path)


class Runner:
    """Runs steps (shell commands, as nvcc's dry run prints them) in nvcc's environment;
    a signal stops every step running and ends the script."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.running: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.RLock()  # (a signal's handler runs in the thread holding it)
        self.failed: list[int] = []
        self.signum = 0

    def run(self, commands: list[str], deps: tuple[str, str] | None = None) -> bool:
        """Run ``commands``, one after another; ``deps`` (the device preprocessing's output
        and ``-MD``'s target) for nvcc's own step that writes the dependency file."""
        for command in commands:
            with self.lock:
                if self.failed:
                    return False
                if command.startswith(DEPS_STEP) and deps is not None:
                    try:
                        write_deps(deps[0], deps[1], command[len(DEPS_STEP):].strip())
                    except (OSError, IndexError, UnicodeDecodeError) as exc:
                        sys.stderr.write(f"wheelforge nvcc-steps: the dependency file: "
                                         f"{exc}\n")
                        self.failed.append(1)
                        return False
                    continue
                proc = subprocess.Popen(["/bin/sh", "-c", command], env=self.env)
                self.running.add(proc)
                if self.signum:  # it came while this step started
                    proc.send_signal(self.signum)
            code = proc.wait()
            with self.lock:
                self.running.discard(proc)
                if code:
                    self.failed.append(128 - code if code < 0 else code)
                    return False
        return True

    def stop(self, signum: int, _frame: object) -> None:
        with self.lock:
            self.failed.append(128 + signum)
            self.signum = signum
            for proc in self.running:
                proc.send_signal(signum)


def section(obj: str, name: str) -> bytes | None:
    """The bytes of section ``name`` of object ``obj`` (objcopy), or None."""
    out = obj + ".wf-section"
    done = subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", obj, out],
                          capture_output=True)
    try:
        with open(out, "rb") as f:
            return f.read() if done.returncode == 0 else None
    except OSError:
        return None
    finally:
        if os.path.exists(out):
            os.unlink(out)


def differs(nvcc: str) -> str | None:
    """The file that marks ``nvcc`` (this file, its size and time: another toolkit is
    tried afresh) as one whose fatbin file is not the placeholder's, in the launcher's
    directory; None without one."""
    state = os.environ.get(STATE_ENV)
    if not state:
        return None
    try:
        real = os.path.realpath(shutil.which(nvcc) or nvcc)
        info = os.stat(real)
    except OSError:
        return None
    key = hashlib.sha256(f"{real}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()
    return os.path.join(state, f"fatbin-differs-{key[:16]}")


def compile_unit(nvcc: str, args: list[str], fifo: str) -> int:
    """The unit's steps with the host compile beside ptxas; nvcc as given where they are
    not the expected ones."""
    dry = subprocess.run([nvcc, *args, "--dryrun"], capture_output=True, text=True)
    plan = Plan(dry.stderr)
    if dry.returncode != 0 or not plan.usable():
        return plain(nvcc, args)
    fat_i = plan.index("fatbinary")[0]
    fat = plan.steps[fat_i]
    embedded = re.search(r'--embedded-fatbin="([^"]+)"', fat)
    raw = re.search(r'--create="([^"]+)"', fat)
    out = args[args.index("-o") + 1]
    if not embedded or not raw:
        return plain(nvcc, args)
    for line in plan.other:
        print(line, file=sys.stderr)
    aside = embedded.group(1) + ".wf"  # fatbinary's own file, for the check
    steps = list(plan.steps)
    steps[fat_i] = fat.replace(embedded.group(0), f'--embedded-fatbin="{aside}"')
    env = dict(os.environ, **plan.assigns)
    runner = Runner(env)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, runner.stop)
    last_cicc = plan.index("cicc")[-1]
    host = [steps[i] for i in plan.index("hostcc")]
    device_done = threading.Event()
    host_ok: list[bool] = []
    took: list[bool] = []

    def host_compile() -> None:
        token = take_token(fifo, device_done)
        took.append(token is not None)
        try:
            host_ok.append(runner.run(host))
        finally:
            if token:
                give_token(fifo, token)

    devpre = [output_of(steps[i]) for i in plan.index("devpre")]
    deps = (devpre[0], out) if devpre and devpre[0] else None
    try:
        if not runner.run(steps[:last_cicc + 1], deps):
            return runner.failed[0]
        with open(embedded.group(1), "w") as stand_in:  # the host stub includes it by name
            stand_in.write(PLACEHOLDER)
        beside = threading.Thread(target=host_compile)
        beside.start()
        device_ok = runner.run(steps[last_cicc + 1:fat_i + 1])
        device_done.set()
        beside.join()
        if not (device_ok and host_ok and host_ok[0]):
            return runner.failed[0] if runner.failed else 1
        return put_fatbin(nvcc, runner, host, out, raw.group(1), embedded.group(1), aside,
                          took[0])
    finally:
        for i in plan.index("rm"):  # nvcc's intermediate files, as nvcc removes them
            for path in shlex.split(steps[i])[1:]:
                if not path.startswith("-"):
                    discard(path)
        discard(aside)


def put_fatbin(nvcc: str, runner: Runner, host: list[str], out: str, fatbin_path: str,
               embedded: str, aside: str, took: bool) -> int:
    """The object compiled against the placeholder, with fatbinary's fatbin put into its
    ``.nv_fatbin`` section where fatbinary's own file is the placeholder but for the data;
    else its host compile again, as nvcc runs it, against fatbinary's file."""
    with open(fatbin_path, "rb") as fatbin:
        data = fatbin.read()
    data += b"\0" * (-len(data) % 8)
    with open(aside) as text:
        fits = placeholder_matches(text.read())
    if fits:
        done = subprocess.run(["objcopy", "--update-section",
                               f".nv_fatbin={fatbin_path}", out])
        fits = done.returncode == 0 and section(out, ".nv_fatbin") == data
    if not fits:  # as nvcc compiles it: against fatbinary's own file
        os.replace(aside, embedded)
        if not runner.run(host):
            return runner.failed[0]
        report("again", out)
        marker = differs(nvcc)
        if marker:  # the next units: nvcc as given (correct either way, cheaper)
            try:
                with open(marker, "w") as f:
                    f.write("this nvcc's fatbin file is not nvccsteps.py's placeholder\n")
            except OSError:
                pass
    else:
        report("beside" if took else "after", out)
    return 0


def discard(path: str) -> None:
    """Remove a file if it is there; a file that cannot be removed stays (nvcc's own
    ``rm`` steps do not fail a unit either)."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def report(how: str, out: str) -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as f:  # one short line: appended whole
            f.write(f"{how} {out}\n")


def plain(nvcc: str, args: list[str]) -> int:
    if "-o" in args[:-1] and os.path.basename(nvcc) == "nvcc":
        report("plain", args[args.index("-o") + 1])
    os.execvp(nvcc, [nvcc, *args])
    return 127  # (not reached)


def threads(args: list[str]) -> int | None:
    """nvcc's ``--threads`` (``-t``; torch gives ``--threads NVCC_THREADS``): the last one,
    1 without; None if it is not a number."""
    value = "1"
    for i, arg in enumerate(args):
        if arg in ("-t", "--threads") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(("-t=", "--threads=")):
            value = arg.partition("=")[2]
    return int(value) if value.isdigit() else None


#: What a shell reads in a path: nvcc's dry run leaves some paths unquoted (its rm steps')
_SHELL_CHARS = re.compile(r"[\s'\"\\$`]")


def unquotable(args: list[str]) -> bool:
    """Whether the unit's paths (its ``.cu``, ``-o`` and ``-MF``; nvcc's temporary files
    are named after the unit) hold a quote, a backslash, a dollar, a backtick or a space:
    nvcc's dry run prints them unquoted in places, so its steps cannot be read back as
    the words nvcc runs; nvcc then runs as given."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-o", "-MF")]
    paths += [arg for arg in args if arg.endswith(".cu")]
    return any(_SHELL_CHARS.search(path) for path in paths)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: nvccsteps.py NVCC ARGS...", file=sys.stderr)
        return 2
    nvcc, args = argv[0], argv[1:]
    fifo = jobserver_fifo(os.environ.get("MAKEFLAGS", ""))
    if (os.path.basename(nvcc) != "nvcc" or fifo is None or shutil.which("objcopy") is None
            or "-c" not in args or args.count("-o") != 1 or args[-1] == "-o"
            or ("-MD" in args and "-MF" not in args[:-1]) or threads(args) != 1
            or any(a in PLAIN for a in args) or unquotable(args)):
        return plain(nvcc, args)
    marker = differs(nvcc)
    if marker and os.path.exists(marker):  # a unit before found the fatbin file unlike
        return plain(nvcc, args)
    try:
        return compile_unit(nvcc, args, fifo)
    except OSError as exc:  # a full disk, say: the unit fails with what failed, no traceback
        print(f"wheelforge nvcc-steps: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
