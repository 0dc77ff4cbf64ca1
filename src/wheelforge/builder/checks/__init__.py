"""The machine checked before a build.

:mod:`.preflight` checks that a build's results can be written (access, free space);
:mod:`.doctor` checks the whole machine and prints one finding per check.
"""
