"""The pipeline for one wheel, in rooms by concern.

Beside the rooms, :mod:`.config` resolves the settings (defaults, project file,
environment, CLI); :mod:`.pipeline` runs one build's steps in order and publishes the
result; :mod:`.scheduler` runs several builds of one command at once (a recipe and its
companions) on one pool of compile slots.

The rooms, bottom to top (``tests/test_architecture.py`` holds them to that order):

- :mod:`.source`: the pinned source fetched, unpacked and patched;
- :mod:`.env`: the build environment (an interpreter, or a managed venv);
- :mod:`.compiling`: the CUDA toolkit, the PEP 517 build, the pool of compile slots, the
  compile cache, the unit costs, and a failed compile's named cause;
- :mod:`.artifact`: a build's identity and the wheel it gives (verify, fatbin, platform
  tag, SBOM, reproducible bytes, the import check);
- :mod:`.checks`: the machine checked before a build (preflight, doctor).

May import: :mod:`wheelforge.recipe`, :mod:`wheelforge.index` (publishing) and the
primitives; never the nightly, the consumers or the CLI.
"""
