"""What users of an index do: install the stack and prove it on a GPU.

:mod:`.install` writes the install instructions (pip and uv) for an index;
:mod:`.stack` installs a channel whole, with its dependencies, and imports it (the stack
check); :mod:`.gputest` runs a recipe's GPU test against a published wheel.

May import: :mod:`wheelforge.index`, :mod:`wheelforge.builder`, :mod:`wheelforge.recipe`
and the primitives; never the nightly or the CLI (the nightly runs the stack check).
"""
