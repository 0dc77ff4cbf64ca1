"""What a recipe's maintainer does between builds: the patch series as a git repository
(:mod:`.patchwork`: start, export, rebase), the recipe's ``patches:`` list edited as text
(:mod:`.recipefile`), and what upstream has beyond the pins (:mod:`.outdated`).

May import: :mod:`wheelforge.builder`, :mod:`wheelforge.recipe` and the primitives; never
the CLI.
"""
