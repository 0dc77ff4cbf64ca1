"""builder/compiling/nvccsteps.py: a unit's host compile beside its ptxas, with the real nvcc.

Each compile here is the CUDA unit below (a template kernel, three instantiations: a few
seconds), with the options a build gives nvcc; the objects are linked into a shared
object with g++ as torch's link does, and compared byte for byte with nvcc's own.
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wheelforge.builder.artifact import reproducible
from wheelforge.builder.compiling import jobserver, nvccsteps

pytestmark = pytest.mark.nvcc

STEPS = Path(nvccsteps.__file__)

UNIT = """\
#include <cuda/std/array>
template <int N> __global__ void total(float* out, long n) {
  cuda::std::array<float, N> a{};
  float s = 0;
  for (int k = 0; k < N; ++k) s += a[k] * k;
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = s;
}
template __global__ void total<4>(float*, long);
template __global__ void total<8>(float*, long);
template __global__ void total<16>(float*, long);
void launch(float* out, long n) { total<4><<<1, 32>>>(out, n); }
"""


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A jobserver's named pipe (GNU make's protocol), held open as the pool holds it."""
    path = tmp_path / "jobs.fifo"
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield path, fd
    finally:
        os.close(fd)


def tokens_in(fd: int) -> int:
    count = 0
    while True:
        try:
            count += len(os.read(fd, 64))
        except BlockingIOError:
            return count


def compile_args(nvcc: str, src: Path, out: Path) -> list[str]:
    """The unit's nvcc command as torch's ninja file writes it (``-MD -MF``, ``-c`` at the
    end of its cflags and again before ``SRC -o OUT``, ``--threads NVCC_THREADS``), with
    the options a build adds (builder/artifact/reproducible.py's and
    builder/compiling/jobserver.py's)."""
    flags = reproducible.nvcc_flags(Path(nvcc)) + jobserver.nvcc_flags(Path(nvcc))
    return [nvcc, *flags, "-MD", "-MF", f"{out}.d", "-I/usr/include", "-c", "-c", str(src),
            "-o", str(out), "-O3", "-lineinfo", "--compiler-options", "-fPIC", "--threads",
            "1", "-gencode=arch=compute_120,code=sm_120", "-std=c++20"]


def run_steps(args: list[str], cwd: Path, makeflags: str | None,
              report: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    env[nvccsteps.REPORT_ENV] = str(report)
    if makeflags is not None:
        env["MAKEFLAGS"] = makeflags
    return subprocess.run([sys.executable, "-I", "-S", str(STEPS), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def linked(obj: Path) -> bytes:
    so = obj.with_suffix(".so")
    subprocess.run(["g++", "-shared", str(obj), "-o", str(so)], check=True)
    return so.read_bytes()


def test_the_extension_is_nvccs_byte_for_byte_beside_after_or_plain(
        tmp_path: Path, nvcc: str, fifo: tuple[Path, int]) -> None:
    """nvcc alone; the steps with a token free (the host compile beside ptxas); with none
    (after fatbinary, on the unit's own slot); without a jobserver (nvcc as given).  The
    linked objects are one file's bytes; each unit left only its object in its directory
    and the token went back."""
    path, fd = fifo
    makeflags = f" -j4 --jobserver-auth=fifo:{path}"
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    report = tmp_path / "report.txt"
    shared, deps = {}, {}
    for how in ("nvcc", "beside", "after", "plain"):
        folder = tmp_path / how
        folder.mkdir()
        out = folder / "k.o"
        args = compile_args(nvcc, src, out)
        if how == "nvcc":
            subprocess.run(args, check=True, cwd=tmp_path, timeout=300)
        else:
            if how == "beside":
                os.write(fd, b"+")
            if how == "after":  # the token the host compile took beside is back: take it
                assert tokens_in(fd) == 1
            done = run_steps(args, tmp_path, None if how == "plain" else makeflags, report)
            assert done.returncode == 0, done.stderr
            if how != "plain":  # (plain: ptxas says it found no jobserver, as it should)
                assert "jobserver" not in done.stderr.lower(), done.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["k.o", "k.o.d"]
        # the dependency file nvcc writes itself (torch's ninja file asks for it)
        deps[how] = (folder / "k.o.d").read_text().replace(str(folder), "FOLDER")
        shared[how] = linked(out)
    assert deps["beside"] == deps["after"] == deps["plain"] == deps["nvcc"]
    assert deps["nvcc"].startswith(f"FOLDER/k.o : {src} \\\n    ")
    assert "cuda/std/array" in deps["nvcc"]
    assert shared["beside"] == shared["nvcc"]
    assert shared["after"] == shared["nvcc"]
    assert shared["plain"] == shared["nvcc"]
    assert [line.split()[0] for line in report.read_text().splitlines()] == [
        "beside", "after", "plain"]
    assert tokens_in(fd) == 0  # none was made up


def test_the_placeholder_is_fatbinarys_file_but_for_the_data(tmp_path: Path,
                                                              nvcc: str) -> None:
    """The file fatbinary writes for the host compile (nvcc --keep) is the placeholder
    but for its data, which is the fatbin's bytes; another text is not."""
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    keep = tmp_path / "keep"
    keep.mkdir()
    subprocess.run([nvcc, "-arch=sm_120", "-c", str(src), "-o", str(tmp_path / "k.o"),
                    "--keep", "--keep-dir", str(keep)], check=True, cwd=tmp_path, timeout=300)
    [text_file] = keep.glob("*.fatbin.c")
    [raw] = [p for p in keep.glob("*.fatbin") if p.suffix == ".fatbin"]
    text = text_file.read_text()
    assert nvccsteps.placeholder_matches(text)
    assert nvccsteps.placeholder_matches(nvccsteps.PLACEHOLDER)
    quads = [int(q, 16) for line in text.splitlines() if line.startswith('".quad ')
             for q in line[len('".quad '):-len('\\n"')].split(",")]
    data = raw.read_bytes()
    assert b"".join(q.to_bytes(8, "little") for q in quads) == data + b"\0" * (-len(data) % 8)
    assert not nvccsteps.placeholder_matches(text.replace("0x466243b1", "0x466243b2"))
    assert not nvccsteps.placeholder_matches(text.replace("#endif\n", "", 1))
    assert not nvccsteps.placeholder_matches("")


def test_a_fatbin_file_unlike_the_placeholder_compiles_the_host_again(
        tmp_path: Path, nvcc: str, fifo: tuple[Path, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(as a later CUDA that writes the file otherwise would): the host compile runs
    again against fatbinary's own file, and the extension is still nvcc's; that nvcc is
    marked, and its next unit runs nvcc as given (not its host compile twice)."""
    path, fd = fifo
    os.write(fd, b"+")
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    ref, out = tmp_path / "ref" / "k.o", tmp_path / "new" / "k.o"
    ref.parent.mkdir()
    out.parent.mkdir()
    subprocess.run(compile_args(nvcc, src, ref), check=True, cwd=tmp_path, timeout=300)
    monkeypatch.setenv("MAKEFLAGS", f" -j2 --jobserver-auth=fifo:{path}")
    monkeypatch.setenv(nvccsteps.REPORT_ENV, str(tmp_path / "report.txt"))
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv(nvccsteps.STATE_ENV, str(state))
    monkeypatch.setattr(nvccsteps, "_FATBIN_C", nvccsteps._FATBIN_C.replace(
        "#endif\n", "#endif /* another CUDA */\n", 1))
    args = compile_args(nvcc, src, out)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert nvccsteps.compile_unit(args[0], args[1:], str(path)) == 0
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert (tmp_path / "report.txt").read_text().split()[0] == "again"
    assert linked(out) == linked(ref)
    assert sorted(p.name for p in out.parent.iterdir()) == ["k.o", "k.o.d", "k.so"]
    [marker] = state.iterdir()
    assert marker.name.startswith("fatbin-differs-")
    monkeypatch.undo()  # the real placeholder again: the mark alone decides
    os.write(fd, b"+")
    env = {**os.environ, "MAKEFLAGS": f" -j2 --jobserver-auth=fifo:{path}",
           nvccsteps.REPORT_ENV: str(tmp_path / "report.txt"),
           nvccsteps.STATE_ENV: str(state)}
    done = subprocess.run([sys.executable, "-I", "-S", str(STEPS), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "report.txt").read_text().split()[2] == "plain"


def test_a_failing_step_fails_the_unit_and_leaves_no_intermediate_files(
        tmp_path: Path, nvcc: str, fifo: tuple[Path, int]) -> None:
    path, _ = fifo
    src = tmp_path / "bad.cu"
    src.write_text(UNIT.replace("s += a[k] * k;", "s += undeclared;"))
    out = tmp_path / "out" / "bad.o"
    out.parent.mkdir()
    done = run_steps(compile_args(nvcc, src, out), tmp_path,
                     f" -j2 --jobserver-auth=fifo:{path}", tmp_path / "report.txt")
    assert done.returncode != 0
    assert 'identifier "undeclared" is undefined' in done.stderr
    assert [p.name for p in out.parent.iterdir()] in ([], ["bad.o.d"])
    assert not (tmp_path / "report.txt").exists()


def test_a_file_it_cannot_write_fails_the_unit_without_a_traceback(
        tmp_path: Path, nvcc: str, fifo: tuple[Path, int]) -> None:
    """(the placeholder's path taken by a directory, as a full disk would refuse it): the
    unit fails with what failed, and its intermediate files are gone."""
    path, _ = fifo
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    out = tmp_path / "out" / "k.o"
    out.parent.mkdir()
    (out.parent / "k.o.fatbin.c").mkdir()
    done = run_steps(compile_args(nvcc, src, out), tmp_path,
                     f" -j2 --jobserver-auth=fifo:{path}", tmp_path / "report.txt")
    assert done.returncode == 1
    assert "wheelforge nvcc-steps: [Errno 21] Is a directory" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["k.o.d", "k.o.fatbin.c"]


def test_a_signal_stops_the_units_steps(tmp_path: Path, nvcc: str,
                                        fifo: tuple[Path, int]) -> None:
    """SIGTERM (the gate forwards ninja's): the running step ends too, the script ends
    with 128 + 15, and no step of the unit is left running."""
    path, _ = fifo
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    out = tmp_path / "k.o"
    env = {**os.environ, "MAKEFLAGS": f" -j2 --jobserver-auth=fifo:{path}"}
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(STEPS),
                             *compile_args(nvcc, src, out)], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
    children = f"/proc/{proc.pid}/task/{proc.pid}/children"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not Path(children).read_text().split():
        time.sleep(0.05)  # a step is running
    steps = Path(children).read_text().split()
    assert steps, "no step started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stderr.read() if proc.stderr \
        else ""
    for pid in steps:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.parametrize("extra", [["-E"], ["--threads", "2"], ["-t=4"], ["-M"],
                                   ["--time", "t.csv"]])
def test_nvcc_runs_as_given_outside_a_plain_compile(tmp_path: Path, nvcc: str,
                                                    fifo: tuple[Path, int],
                                                    extra: list[str]) -> None:
    path, _ = fifo
    src = tmp_path / "k.cu"
    src.write_text(UNIT)
    args = compile_args(nvcc, src, tmp_path / "k.o")
    if extra[0] in ("-E", "-M"):  # (nvcc refuses them with -MD and -objtemp)
        i = args.index("-MD")
        args = [a for a in args[:i] + args[i + 3:] if a != "--objdir-as-tempdir"]
    args = args + extra  # (after torch's --threads 1: the last one counts)
    done = run_steps(args, tmp_path, f" -j2 --jobserver-auth=fifo:{path}",
                     tmp_path / "report.txt")
    assert done.returncode == 0, done.stderr
    report = tmp_path / "report.txt"
    assert not report.exists() or report.read_text().split()[0] == "plain"


def test_other_steps_than_the_expected_ones_run_nvcc_as_given() -> None:
    """A dry run whose steps are not nvcc 13's for one unit (another order, a device
    link) is not used: nvcc then runs the unit itself."""
    def dry(*steps: str) -> nvccsteps.Plan:
        return nvccsteps.Plan("#$ _NVVM_BRANCH_=nvvm\n#$ INCLUDES=\"-I/a\"  \"-I/b\"\n"
                              + "".join(f"#$ {s}\n" for s in steps))

    host_pre = "gcc -E -x c++ -D__CUDACC__ k.cu -o k.cpp4.ii"
    dev_pre = "gcc -D__CUDA_ARCH__=1200 -E -x c++ k.cu -o k.cpp1.ii"
    usual = [host_pre, "cudafe++ --gen_c_file_name k.cudafe1.cpp k.cpp4.ii", dev_pre,
             '"$CICC_PATH/cicc" k.cpp1.ii -o k.ptx', "ptxas -arch=sm_120 k.ptx -o k.cubin",
             'fatbinary --create="k.fatbin" --embedded-fatbin="k.fatbin.c"',
             "gcc -c -x c++ k.cudafe1.cpp -o k.o", "rm k.ptx"]
    plan = dry(*usual)
    assert plan.usable()
    assert plan.assigns == {"_NVVM_BRANCH_": "nvvm", "INCLUDES": '"-I/a"  "-I/b"'}
    assert plan.kinds == ["hostpre", "cudafe++", "devpre", "cicc", "ptxas", "fatbinary",
                          "hostcc", "rm"]
    two_archs = usual[:5] + [dev_pre.replace("1200", "900"), usual[3], usual[4]] + usual[5:]
    assert dry(*two_archs).usable()
    assert not dry(*usual[:6], "nvlink k.cubin", *usual[6:]).usable()
    # -MD: the device preprocessing first, then nvcc's own step for the dependency file
    filtered = [dev_pre, host_pre, "-- Filter Dependencies -- > k.o.d", usual[1], *usual[3:]]
    assert dry(*filtered).usable() and "deps" in dry(*filtered).kinds
    assert not dry(*filtered[:5], dev_pre, *filtered[5:]).usable()  # which one's read?
    assert not dry(usual[0], *usual[2:]).usable()  # no cudafe++ (no host stub)
    assert not dry(*usual[:3], *usual[4:]).usable()  # no cicc
    assert not dry(*usual[:6]).usable()
    assert not dry(*usual[:4], "ptxas a", "ptxas b", *usual[5:]).usable()


def test_the_launcher_runs_the_script_and_goes_in_front_of_nvcc_or_ccache(
        tmp_path: Path) -> None:
    environ: dict[str, str] = {}
    command = jobserver.steps_in_front("/usr/local/cuda/bin/nvcc --x", environ, tmp_path)
    script = Path(shlex.split(command)[0])
    assert command == f"{shlex.quote(str(script))} /usr/local/cuda/bin/nvcc --x"
    assert environ == {}
    assert script.stat().st_mode & stat.S_IXUSR
    assert str(STEPS.resolve()) in script.read_text()
    assert f"{nvccsteps.STATE_ENV}={script.parent} exec " in script.read_text()
    # under ccache: its prefix (ccache runs it with nvcc when it compiles)
    cached = jobserver.steps_in_front("/env/bin/ccache /usr/local/cuda/bin/nvcc --x",
                                      environ, tmp_path)
    assert cached == "/env/bin/ccache /usr/local/cuda/bin/nvcc --x"
    assert environ == {"CCACHE_PREFIX": str(script)}
    # a prefix of the user's own (distcc, icecc) stays: nvcc then runs its steps itself
    theirs = {"CCACHE_PREFIX": "distcc"}
    assert jobserver.steps_in_front("/env/bin/ccache nvcc", theirs, tmp_path) == \
        "/env/bin/ccache nvcc"
    assert theirs == {"CCACHE_PREFIX": "distcc"}
    # the same script the next time; another command (not nvcc) runs as given
    written = script.stat().st_mtime_ns
    assert jobserver.steps_in_front("/usr/local/cuda/bin/nvcc --x", {}, tmp_path) == command
    assert script.stat().st_mtime_ns == written
    done = subprocess.run([str(script), "/bin/echo", "-c", "x", "-o", "y"],
                          capture_output=True, text=True, check=True)
    assert done.stdout == "-c x -o y\n"
    usage = subprocess.run([str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: nvccsteps.py NVCC ARGS" in usage.stderr


def test_nvccs_threads_are_read_as_nvcc_reads_them() -> None:
    assert nvccsteps.threads(["-c", "k.cu"]) == 1
    assert nvccsteps.threads(["--threads", "1", "-c"]) == 1
    assert nvccsteps.threads(["--threads", "1", "-t", "4"]) == 4
    assert nvccsteps.threads(["-t=2"]) == 2 and nvccsteps.threads(["--threads=1"]) == 1
    assert nvccsteps.threads(["--threads", "0"]) == 0  # (0: as many as nvcc likes)
    assert nvccsteps.threads(["--threads", "x"]) is None


def test_a_jobserver_that_has_gone_gives_no_token_and_takes_none_back(tmp_path: Path) -> None:
    """(the pool's directory removed under a unit): the host compile runs after
    fatbinary, on the unit's own slot, and giving the token back is a no-op."""
    gone = str(tmp_path / "no.fifo")
    assert nvccsteps.take_token(gone, threading.Event()) is None
    nvccsteps.give_token(gone, b"+")  # no error
    assert nvccsteps.jobserver_fifo(" -j4 --jobserver-auth=fifo:/a/b") == "/a/b"
    assert nvccsteps.jobserver_fifo(" -j4 --jobserver-auth=3,4") is None
