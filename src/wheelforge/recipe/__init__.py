"""Recipes and the build matrix as pure data.

A recipe (:mod:`.model`, read from YAML by :mod:`.format`) pins one extension to an
immutable source plus patches; the matrix (:mod:`.matrix`) is the nightly's recipes x
interpreters x torch x archs. YAML is read safely (:mod:`wheelforge._yaml`) into frozen
dataclasses, every problem reported at once with file and key path.

May import: the primitives (``errors``, ``_yaml``, ``arch``, ``_fs``). Nothing here builds,
publishes or runs a process.
"""
