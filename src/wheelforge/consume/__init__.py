"""What users of an index do: install the stack and prove it on a GPU.

:mod:`.install` writes the install instructions (pip and uv) for an index;
:mod:`.stack` installs a channel whole, with its dependencies, and imports it (the stack
check); :mod:`.gputest` runs a recipe's GPU test against a published wheel.
:mod:`._stackimports` (the stack check's imports) and :mod:`._gpuprobe` (the GPU test's
question to torch) are programs run by their file paths in other interpreters.

May import: :mod:`wheelforge.index`, :mod:`wheelforge.builder`, :mod:`wheelforge.recipe`
and the primitives; never the nightly or the CLI (the nightly runs the stack check).
"""
