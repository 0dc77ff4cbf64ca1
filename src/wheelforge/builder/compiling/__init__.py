"""Compiling a wheel.

:mod:`.toolchain` finds the CUDA toolkit and checks what it can build; :mod:`.backend`
runs the PEP 517 build in the build environment; :mod:`.jobserver` is the pool of compile
slots every build of a command shares (also a GNU make jobserver); :mod:`.nvccsteps` is the
opt-in script in front of nvcc that runs a unit's host compile beside its ptxas;
:mod:`.compilecache` routes compiles through ccache or sccache; :mod:`.unitcosts` records
each unit's cost; :mod:`.diagnose` names a failed build's cause from its log
(``failures.yaml`` beside it).
"""
