"""The nightly wheel cache: the matrix's cells built on one machine or fanned out.

:mod:`.night` holds the cells' results, the in-process nightly, its report and the
retention (prune); :mod:`.fanout` the plan / run / publish parts and the GitHub Actions
matrix; :mod:`.rayexec` the Ray executor over the same parts.

May import: :mod:`wheelforge.build`, :mod:`wheelforge.index`, :mod:`wheelforge.recipe`
and the primitives; never the CLI.
"""
