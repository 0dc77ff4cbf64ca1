"""The build environment a wheel is compiled in.

:mod:`.buildenv` makes or inspects it (an interpreter, or a cached managed venv);
:mod:`.pipconfig` carries pip's configuration over to uv; :mod:`.envlock` says who may
change a managed environment and when; :mod:`.bytecode` compiles the bytecode of the
build's imports where the caller's environment writes none; :mod:`._probe` is the program
:mod:`.buildenv` runs in an interpreter to ask it about itself (by its file path).
"""
