"""The suite's cost tiers: every test is ``unit``, ``integration`` or ``e2e``.

- ``unit``: pure Python in the test's own process; no child process at all (no pip, uv,
  venv, git, server process, torch environment, nvcc).  Threads and servers on 127.0.0.1
  in the test's process are fine.  `make test-fast` runs this tier alone, on pytest-xdist
  workers, so a unit test makes its files under ``tmp_path`` only.
- ``integration``: child processes: pip and uv into venvs, managed torch environments,
  servers (nginx, redis, the index), Chromium, git, the wheelforge command as a process.
- ``e2e``: the real CUDA compiler: real upstream builds (tests/test_e2e_*.py) and the CUDA
  fixture (tests/packages/tinyext).  Every test marked ``nvcc`` or ``e2e`` is here.

A test's tier is, in this order: its own marker (``@pytest.mark.unit`` and so on, for a
test whose module is mostly of another tier), ``e2e`` for a test marked ``nvcc``, else its
module's tier in ``MODULES`` below.  A module missing from the table is ``integration``
(no guard, not in the fast tier) until someone puts it there.

The guard: while a unit test runs (its set-up and tear-down included), starting a process
raises ``UnitStartedAProcess``, which names the test and the command.  A unit test that
needs a process belongs to the integration tier: mark it so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("unit", "integration", "e2e")

#: each test module's tier (decided by reading it, and by a run with the guard on every test)
MODULES: dict[str, str] = {
    # unit: pure Python (a few tests in them are marked integration or e2e)
    "test_arch.py": "unit",
    "test_managed_toolkit.py": "unit",  # its real build is marked nvcc: e2e
    "test_torch_toolkit.py": "unit",  # its command runs are marked integration
    "test_cli.py": "unit",  # the command in-process (tests/cli_inprocess.py)
    "test_architecture.py": "unit",
    "test_companions.py": "unit",
    "test_config.py": "unit",
    "test_coverage.py": "unit",
    "test_diagnose.py": "unit",
    "test_download.py": "unit",
    "test_fanout.py": "unit",
    "test_fatbin.py": "unit",
    "test_first_day.py": "unit",  # the command in-process where only its text is checked
    "test_first_hour.py": "unit",  # likewise
    "test_second_day.py": "unit",  # likewise: issue 53's second newcomer day
    "test_gputest.py": "unit",
    "test_hostile.py": "unit",
    "test_index.py": "unit",
    "test_managed_env.py": "unit",
    "test_matrix.py": "unit",
    "test_recipe.py": "unit",
    "test_reproducible.py": "unit",
    "test_sbom.py": "unit",
    "test_serve_limits.py": "unit",
    "test_shared_cache.py": "unit",
    "test_source.py": "unit",
    "test_subsets.py": "unit",
    "test_tiers.py": "unit",
    "test_unit_costs.py": "unit",
    "test_wheel.py": "unit",
    "test_zip.py": "unit",
    # integration: processes (a few pure tests in them are marked unit)
    "test_bytecode.py": "integration",
    "test_causal_conv1d_patches.py": "integration",  # git apply on the real sdist
    "test_consumer_matrix.py": "integration",  # pip and uv against the index, venvs
    "test_doctor.py": "integration",
    "test_envlock.py": "integration",
    "test_faults.py": "integration",  # the wheelforge command with injected faults
    "test_flash_attn_patches.py": "integration",  # the real flash-attn sdist, patched
    "test_git_source.py": "integration",
    "test_gpustack.py": "integration",
    "test_importcheck.py": "integration",
    "test_index_clients.py": "integration",
    "test_index_stress.py": "integration",
    "test_install.py": "integration",
    "test_coverage_page.py": "integration",  # Chromium
    "test_landing_page.py": "integration",  # Chromium
    "test_mamba_split_patch.py": "integration",
    "test_mamba_ssm_patches.py": "integration",
    "test_nightly.py": "integration",
    "test_nightly_canary.py": "integration",
    "test_nightly_report.py": "integration",  # Chromium
    "test_nightly_subsets.py": "integration",
    "test_orphans.py": "integration",
    "test_outdated.py": "integration",
    "test_patch.py": "integration",
    "test_patchflow.py": "integration",
    "test_platform.py": "integration",
    "test_publisher_verifies.py": "integration",
    "test_scheduler.py": "integration",
    "test_split_patch.py": "integration",
    "test_stack.py": "integration",
    "test_static_nginx.py": "integration",  # nginx
    "test_toolchain.py": "integration",
    "test_unit_timeline.py": "integration",
    # e2e: nvcc and real upstream builds (every test in them is marked nvcc)
    "test_build_fixture.py": "e2e",
    "test_e2e_causal_conv1d.py": "e2e",
    "test_e2e_channel_torch211.py": "e2e",  # a second channel (torch 2.11.0), one build
    "test_e2e_flash_attn.py": "e2e",
    "test_e2e_mamba_ssm.py": "e2e",
    "test_e2e_stack.py": "e2e",
    "test_interrupt.py": "e2e",
    "test_nvcc_steps.py": "e2e",
    "test_oom.py": "e2e",
    "test_ray_cluster.py": "e2e",
    "test_ray_toolkit.py": "e2e",
    # added with issues 51-53 (the guard ran over the unit ones)
    "test_house.py": "unit",  # the source read with ast
    "test_nvcc_defaults.py": "integration",  # a stand-in nvcc --help
    "test_nvcc_steps_quotes.py": "unit",
    "test_publisher_rules.py": "integration",  # wheels made in-process, the publish command
    "test_reader_fuzz.py": "unit",  # hypothesis over the readers
    "test_stage_paths.py": "integration",  # the publish command
    "test_hostile_index.py": "integration",  # the commands against a hostile server
    "test_install_refusals.py": "integration",  # real pip and venvs
    "test_patch_doors.py": "integration",  # git
    "test_proc_timeouts.py": "integration",  # children that hang, close, ignore SIGTERM
    "test_says_what_it_does.py": "integration",  # serve, Chromium, shells
    "test_stack_skip.py": "integration",  # a real stack check's venv
    "test_stage_signatures.py": "integration",  # ssh-keygen
    "test_shared_build_path.py": "integration",  # a second user through setpriv
    # added with issue 55
    "test_stable_abi.py": "unit",  # the audit's fixtures (g++) are marked integration
    "test_e2e_stable_abi.py": "e2e",  # one stable-ABI build, loaded under three torches
    "test_stable_abi_mamba.py": "unit",  # its g++ compiles and pure builds: integration
    "test_e2e_stable_abi_mamba.py": "e2e",  # the ported binding loaded under three torches
    "test_workers.py": "unit",  # make test's xdist groups (tests/workers.py)
}


def tier_of(item: pytest.Item) -> str:
    """The tier of ``item``: its own tier marker, e2e for nvcc, else its module's."""
    own = [t for t in TIERS if item.get_closest_marker(t) is not None]
    if len(own) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(own)}: one tier only")
    if own:
        return own[0]
    if item.get_closest_marker("nvcc") is not None:
        return "e2e"
    return MODULES.get(item.path.name, "integration")


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give each item its tier's marker, so that ``-m unit`` (and so on) selects it."""
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        item.stash[TIER] = tier


TIER = pytest.StashKey[str]()


class UnitStartedAProcess(RuntimeError):
    """A unit-tier test tried to start a process."""


@contextmanager
def no_processes(nodeid: str) -> Iterator[None]:
    """Starting a process raises while this is entered: subprocess (and what uses it:
    wheelforge._proc, asyncio), os.fork (multiprocessing), os.posix_spawn, os.system."""

    def refuse(what: object) -> UnitStartedAProcess:
        return UnitStartedAProcess(
            f"{nodeid} is in the unit tier (tests/tiers.py) and started a process: "
            f"{what!r}.  Mark it @pytest.mark.integration (or e2e, for nvcc).")

    def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        raise refuse(args)

    def any_call(name: str) -> Callable[..., Any]:
        def raising(*args: Any, **kw: Any) -> Any:
            raise refuse(f"os.{name}{args[:2]}")
        return raising

    saved: list[tuple[object, str, object]] = [
        (subprocess.Popen, "_execute_child", subprocess.Popen.__dict__["_execute_child"])]
    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
        if hasattr(os, name):
            saved.append((os, name, getattr(os, name)))
            setattr(os, name, any_call(name))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run each unit test (set-up, call and tear-down) with no process allowed."""
    if item.stash.get(TIER, None) != "unit":
        yield
        return
    with no_processes(item.nodeid):
        yield
