"""How `make test` spreads the integration and e2e tiers over two xdist workers.

Many of those tests wait (on pip and PyPI, servers, sleeps, another process) more than
they compute, so a second worker runs beside them; the nvcc builds gain nothing from it
and lose little.  The run asks for ``--dist loadgroup``, and this module decides the
groups (xdist's own ``xdist_group`` marks do not reach its scheduler under pytest 9: the
worker renames ``item._nodeid``, which pytest 9 no longer reads):

- a module is a group, so that its module-scoped fixtures (venvs, servers, patched trees)
  are made once, on one worker;
- the modules that share the session's upstream builds (conftest's ``upstream_cold`` and
  ``upstream_stack``) are one group, ``upstream``: one worker builds them, once (a test
  elsewhere that asks for them fails the collection: it belongs in ``UPSTREAM_MODULES``);
- the groups are sent longest first (``FIRST``, then the suite's order), so that the
  upstream builds start at once and the last group to end is a short one.

What the two workers share is made to be shared: the user's wheelforge cache (its
build-key and environment locks), the fixed build path
(``/tmp/wheelforge-build-UID/NAME-VERSION``, held by one build at a time), ports
(tests/servers.py asks the kernel for free ones).  Without ``--dist loadgroup`` (the
unit tier's ``-n auto``, a run without xdist) nothing here applies.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: the modules whose tests use the session's upstream builds: one group
UPSTREAM_MODULES = frozenset({"test_e2e_causal_conv1d", "test_e2e_mamba_ssm", "test_e2e_stack"})
UPSTREAM_FIXTURES = frozenset({"upstream_cold", "upstream_stack"})
#: groups sent first, longest first (by the durations of the last full runs on 2 cores);
#: the rest follow in the suite's order
FIRST = ("upstream", "test_e2e_flash_attn", "test_reproducible", "test_faults",
         "test_build_fixture", "test_ray_cluster", "test_shared_cache", "test_nightly",
         "test_managed_toolkit", "test_orphans", "test_mamba_ssm_patches", "test_managed_env",
         "test_interrupt", "test_unit_costs")


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id (``tests/test_x.py::test_y[...]``)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return "upstream" if module in UPSTREAM_MODULES else module


def on_a_grouping_worker(config: pytest.Config) -> bool:
    """Whether this process is a worker of a ``--dist loadgroup`` run (xdist sets its
    ``dist`` to "no" and ``loadgroup`` to True)."""
    return bool(getattr(config.option, "loadgroup", False))


def order_for_workers(items: list[pytest.Item]) -> None:
    """Sort ``items`` groups-first by ``FIRST`` (stable: the suite's order within a group
    and among the rest); the scheduler sends the groups in this order.  A test outside
    ``UPSTREAM_MODULES`` that uses the upstream builds is an error."""
    for item in items:
        uses = UPSTREAM_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses and group_of(item.nodeid) != "upstream":
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(uses))}: add its module to "
                "UPSTREAM_MODULES in tests/workers.py (one worker builds them)")
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))


class ModuleGroups(LoadScopeScheduling):
    """xdist's scope scheduling with ``group_of`` as the scope, in the workers' order."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the order order_for_workers made

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
