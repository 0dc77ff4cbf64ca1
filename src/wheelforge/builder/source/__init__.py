"""The pinned source, made ready to build.

:mod:`.fetch` fetches a recipe's source into a content-addressed cache and verifies it
(sdist sha256, git commit); :mod:`.archive` unpacks an archive safely and bounded;
:mod:`.patch` applies the recipe's patch series atomically.
"""
