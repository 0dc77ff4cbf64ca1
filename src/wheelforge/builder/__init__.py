"""The pipeline for one wheel: settings, fetch, extract, patch, preflight, build
environment, compile, verify, diagnose, and the orchestration that publishes the result.

:mod:`.config` resolves the settings (defaults, project file, environment, CLI);
:mod:`.source` and :mod:`.archive` fetch and unpack the pinned source; :mod:`.patch` applies
the series; :mod:`.toolchain`, :mod:`.preflight` and :mod:`.doctor` check CUDA, the
interpreter and the machine; :mod:`.buildenv` makes the managed environment;
:mod:`.backend` (the PEP 517 build in that environment) and :mod:`.compilecache` compile;
:mod:`.fatbin` and :mod:`.verify` check the wheel; :mod:`.diagnose` names a failure's
cause; :mod:`.pipeline` runs the steps in order and publishes to the index.

May import: :mod:`wheelforge.recipe`, :mod:`wheelforge.index` (publishing) and the
primitives; never the nightly, the consumers or the CLI.
"""
