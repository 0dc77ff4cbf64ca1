"""A build's identity and the wheel it gives.

:mod:`.identity` computes the build key, label and lock before anything is built;
:mod:`.reproducible` fixes what would make two builds of a key differ; :mod:`.platform`
finds the manylinux tag; :mod:`.sbom` writes and reads the SBOM a wheel carries;
:mod:`.verify` checks the wheel (SASS/PTX through :mod:`.fatbin`, RECORD, what it installs
through :mod:`.content`, imports through :mod:`.importcheck`, whose program, cold and warm,
is :mod:`._imports`); the platform tag's analysis runs in a child, :mod:`._tagchild`.  The
``_`` modules are programs run by their file paths in other interpreters.
"""
