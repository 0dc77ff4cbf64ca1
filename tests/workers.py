"""How `make test` spreads the integration and e2e tiers over two xdist workers.

Many of those tests wait (on pip and PyPI, servers, sleeps, another process) more than
they compute, so a second worker runs beside them; the nvcc builds gain nothing from it
and lose little.  The run asks for ``--dist loadgroup``, and this module decides the
groups (xdist's own ``xdist_group`` marks do not reach its scheduler under pytest 9: the
worker renames ``item._nodeid``, which pytest 9 no longer reads):

- a module is a group, so that its module-scoped fixtures (venvs, servers, patched trees)
  are made once, on one worker;
- the modules that share a session-scoped build are one group (``SHARED``): ``upstream``
  (conftest's ``upstream_cold`` and ``upstream_stack``; flash-attn's subset build joins
  them, so that no two real upstream builds run at once) and ``tinyext-cold`` (its
  ``tinyext_cold``): one worker builds it, once (a test elsewhere that asks for it fails
  the collection: its module belongs in the group);
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

#: the groups of several modules: those that share a session-scoped build, by the fixtures
#: that make it (a test elsewhere that asks for one fails the collection)
SHARED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # conftest's upstream_cold and upstream_stack (tests/upstream.py), and flash-attn's
    # subset build: every real upstream build on one worker, one after another (two at
    # once could ask more memory than a 2-core runner has: 4 GiB a compile job)
    # (with them: the second channel's causal-conv1d and the stable-ABI causal-conv1d)
    "upstream": (frozenset({"test_e2e_causal_conv1d", "test_e2e_mamba_ssm", "test_e2e_stack",
                            "test_e2e_flash_attn", "test_e2e_channel_torch211",
                            "test_e2e_stable_abi"}),
                 frozenset({"upstream_cold", "upstream_stack"})),
    # the real Ray clusters: test_ray_cluster's ends with `ray stop --force`, which ends
    # every Ray process of the user, so no other cluster may run beside it
    "ray": (frozenset({"test_ray_cluster", "test_ray_toolkit"}), frozenset()),
    # conftest's tinyext_cold (tests/fixture_build.py)
    "tinyext-cold": (frozenset({"test_build_fixture", "test_reproducible"}),
                     frozenset({"tinyext_cold"})),
}
#: groups sent first, longest first (by the durations of the last full runs on 2 cores);
#: the rest follow in the suite's order
FIRST = ("upstream", "tinyext-cold", "test_faults", "ray",
         "test_shared_cache", "test_nightly", "test_managed_toolkit", "test_orphans",
         "test_mamba_ssm_patches", "test_managed_env", "test_interrupt", "test_unit_costs")


def group_of(nodeid: str) -> str:
    """The group of a test, from its node id (``tests/test_x.py::test_y[...]``)."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return next((name for name, (modules, _) in SHARED.items() if module in modules), module)


def on_a_grouping_worker(config: pytest.Config) -> bool:
    """Whether this process is a worker of a ``--dist loadgroup`` run (xdist sets its
    ``dist`` to "no" and ``loadgroup`` to True)."""
    return bool(getattr(config.option, "loadgroup", False))


def order_for_workers(items: list[pytest.Item]) -> None:
    """Sort ``items`` groups-first by ``FIRST`` (stable: the suite's order within a group
    and among the rest); the scheduler sends the groups in this order.  A test outside
    its ``SHARED`` group that uses the group's session build is an error."""
    for item in items:
        for name, (_, fixtures) in SHARED.items():
            uses = fixtures & set(getattr(item, "fixturenames", ()))
            if uses and group_of(item.nodeid) != name:
                raise pytest.UsageError(
                    f"{item.nodeid} uses {', '.join(sorted(uses))}: add its module to "
                    f"SHARED[{name!r}] in tests/workers.py (one worker builds it, once)")
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(FIRST)))


class ModuleGroups(LoadScopeScheduling):
    """xdist's scope scheduling with ``group_of`` as the scope, in the workers' order."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the order order_for_workers made

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)
