"""The local package index: publish wheels atomically and immutably, and
generate PEP 503 / PEP 691 simple pages from what is on disk.

Modules: :mod:`.records` (the sidecar records, wheel inspection, the listing of
``files/``), :mod:`.store` (publish, rebuild, remove, yank: the writers, under the
lock), :mod:`.recovery` (the change journal; finishing or rolling back a change a killed
writer left; quarantine), :mod:`.pages` (the simple pages and their caches),
:mod:`.landing` (the page for people), :mod:`.serve` (the HTTP server).

Layout of an index directory::

    <index>/files/<wheel>               the wheels; immutable once published
    <index>/files/<wheel>.metadata      PEP 658 core metadata: the wheel's METADATA bytes, exactly
    <index>/files/<wheel>.wf.json       sidecar record (WheelRecord): the truth the pages are
                                        generated from, together with the files
    <index>/simple/index.html           PEP 503 root page (every project)
    <index>/simple/index.json           PEP 691 JSON root
    <index>/simple/<project>/index.html, index.json
                                        one project (name normalized per PEP 503), every wheel
    <index>/<channel>/simple/...        one build target ("channel", e.g. cu130-torch2.14): the
                                        same pages, holding only that channel's wheels plus the
                                        channel-less pure wheels; links are relative
                                        (../../../files/<wheel>), so file:// and any web server work
    <index>/index.html                  landing page: one table of every wheel, for people
    <index>/.records/<project>.cache    derived cache: the project's rendered page fragments and
                                        landing-page rows
    <index>/.records/_summary.json      derived cache: each project's channels and file-set digest
    <index>/.records/_writing           present while a change is in progress
    <index>/.lock                       held by every writer (the HTTP server takes no lock)

Everything under ``.records`` is derived and may be deleted at any time.

Point pip or uv at ``<index>/<channel>/simple/`` (or ``<index>/simple/`` for
everything) as ``--index-url``, either as a ``file://`` URL or served by any
static web server or by :func:`make_server`.

Rules:

* A published file never changes.  Publishing the same bytes again is a no-op;
  different bytes under a published name are refused.
* Writes are atomic (temp file in the same directory, fsync, rename), in the
  order wheel, ``.metadata``, sidecar, caches, project pages, root pages,
  landing page.  A crash at any point leaves the old pages valid.  Every
  change holds ``.records/_writing`` while it writes; when the next writer
  finds it left behind, it sweeps the temp files (``.wf-tmp-*``) and rebuilds
  every page from the files before doing its own work.  A wheel without a
  sidecar (a publish killed before its sidecar, or a file copied in by hand)
  gets a record derived from the wheel itself, without a build target;
  publishing the same bytes with a target completes that record.
* A publish lists ``files/`` once (no wheel is re-read or re-hashed), loads
  only the published project's cache (of the other caches it reads only the
  landing-page rows), re-renders only the new wheel's fragments and rewrites
  only the pages whose bytes change: that project's pages, its channel pages,
  the root pages when the project is new, and the landing page.  The caches
  are checked against the file names in ``files/``; a project whose names
  disagree is reloaded from its sidecars.
* :func:`rebuild` regenerates every page from ``files/`` and the sidecars, and
  removes pages no file supports any more.  It trusts each sidecar's sha256
  (only the size is checked against the file) instead of re-hashing every
  wheel; a wheel without a sidecar is hashed and gets one.
* Channel pages list the wheels published with that channel plus the
  channel-less *pure* wheels (ABI ``none``, platform ``any``).  A channel-less
  platform wheel appears only in the top-level ``simple/``.
"""

from .records import (
    FILES_DIR,
    HTML_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    METADATA_SUFFIX,
    NIGHTLY_REPORT,
    REPORTS_DIR,
    SIDECAR_SUFFIX,
    SIMPLE_DIR,
    PublishResult,
    WheelRecord,
    channel_name,
    from_json,
    stable_channel_name,
    to_json,
)
from .recovery import repair
from .serve import ServeLimits, make_server
from .store import (
    BuildPublishResult,
    load_records,
    publish,
    publish_build,
    rebuild,
    record_stack,
    refresh,
    remove,
    set_tested,
    unyank,
    yank,
)

__all__ = [
    "BuildPublishResult",
    "FILES_DIR",
    "HTML_CONTENT_TYPE",
    "JSON_CONTENT_TYPE",
    "METADATA_SUFFIX",
    "NIGHTLY_REPORT",
    "REPORTS_DIR",
    "SIDECAR_SUFFIX",
    "SIMPLE_DIR",
    "PublishResult",
    "ServeLimits",
    "WheelRecord",
    "channel_name",
    "stable_channel_name",
    "from_json",
    "load_records",
    "make_server",
    "publish",
    "publish_build",
    "rebuild",
    "record_stack",
    "refresh",
    "remove",
    "repair",
    "set_tested",
    "to_json",
    "unyank",
    "yank",
]
