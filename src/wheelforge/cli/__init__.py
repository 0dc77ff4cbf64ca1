"""The command line: thin click commands over the other packages.

The only place where a :class:`wheelforge.errors.WheelforgeError` becomes a message and an
exit code. :mod:`.main` holds the group and most commands; :mod:`.nightly` the nightly's.

May import everything; nothing imports it.
"""
