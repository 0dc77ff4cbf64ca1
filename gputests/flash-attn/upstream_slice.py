"""A slice of upstream's tests/test_flash_attn.py (from the pinned sdist), as a pytest plugin.

    pytest -p upstream_slice test_flash_attn.py      (this folder on PYTHONPATH)

Upstream's parametrisations run to tens of thousands of cases. The slice keeps the tests
of the forward and backward output, varlen, causal, split-kv and the KV cache, at the
head dims FA_SLICE_HDIMS (default 64,128,256), and of each test at most FA_SLICE_PER_TEST
cases (default 96), taken round-robin over (dtype, head dim, causal, num_splits) so every
combination is in it; within a combination the order is a hash of the case's id, so the
slice is the same on every run. Upstream's own assertions (its tolerance rule: at most
twice the error of the same reference in the low precision) judge each case.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from itertools import zip_longest

import pytest

TESTS = ("test_flash_attn_output", "test_flash_attn_varlen_output", "test_flash_attn_causal",
         "test_flash_attn_varlen_causal", "test_flash_attn_splitkv", "test_flash_attn_kvcache")
HDIMS = {int(d) for d in os.environ.get("FA_SLICE_HDIMS", "64,128,256").split(",")}
PER_TEST = int(os.environ.get("FA_SLICE_PER_TEST", "96"))


def _params(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _stratum(params: dict[str, object]) -> tuple[str, ...]:
    return tuple(str(params.get(k)) for k in ("dtype", "d", "causal", "num_splits"))


def _slice(items: list[pytest.Item]) -> list[pytest.Item]:
    strata: dict[tuple[str, ...], list[pytest.Item]] = defaultdict(list)
    for item in items:
        strata[_stratum(_params(item))].append(item)
    for members in strata.values():
        members.sort(key=lambda i: hashlib.sha256(i.nodeid.encode()).hexdigest())
    ordered = [i for row in zip_longest(*strata.values()) for i in row if i is not None]
    return ordered[:PER_TEST]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_test: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name in TESTS and _params(item).get("d") in HDIMS:
            by_test[name].append(item)
    keep = {id(i) for members in by_test.values() for i in _slice(members)}
    deselected = [i for i in items if id(i) not in keep]
    items[:] = [i for i in items if id(i) in keep]
    config.hook.pytest_deselected(items=deselected)
