"""Compiling a wheel.

:mod:`.toolchain` finds the CUDA toolkit and checks what it can build; :mod:`.backend`
runs the PEP 517 build in the build environment; :mod:`.jobserver` is the pool of compile
slots every build of a command shares (with WHEELFORGE_JOBSERVER=1 also a GNU make
jobserver for ptxas's threads); :mod:`.nvccsteps` is the
opt-in script in front of nvcc that runs a unit's host compile beside its ptxas;
:mod:`.compilecache` routes compiles through ccache or sccache; :mod:`.unitcosts` records
each unit's cost; :mod:`.diagnose` names a failed build's cause from its log
(``failures.yaml`` beside it).  Programs run by their file paths in the build
environment's interpreter (stdlib only): :mod:`._gate`, the pool's gate in front of each
unit's nvcc; :mod:`._hookrun`, the PEP 517 hook runner; :mod:`.nvccsteps`.
"""
