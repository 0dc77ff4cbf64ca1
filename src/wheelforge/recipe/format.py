"""Recipes: one YAML file per project, read into :mod:`.model`'s frozen dataclasses.

A recipe is pure data.  Loading collects every problem (with the file and the
key path) and raises them together; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import InvalidVersion, Version

from .._yaml import read_yaml
from ..errors import RecipeError
from .fields import Problems, join, limit, requirements, section, string_field, string_list
from .model import (
    BUILD_KINDS,
    DEFAULT_LOCAL_VERSION,
    FORMAT_VERSION,
    LOCAL_VERSION_FIELDS,
    BuildKind,
    BuildSpec,
    ExtractLimits,
    GitSource,
    Recipe,
    SdistSource,
    Source,
    SubsetDimension,
    TestSpec,
    VerifySpec,
)

#: A project name as PEP 508 spells it (packaging's own rule, the one PyPI enforces).
_PROJECT_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(patch|diff)$")
_SDIST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.(tar\.gz|zip|tgz|tar\.bz2|tar\.xz)$")


#: Variables a recipe's ``build.env`` may not set, with the reason: each changes which code
#: runs in the build (an interpreter's startup, the loader's libraries, the programs found,
#: the compiler or its launcher) or is one wheelforge sets and verifies.  ``X*`` is a
#: prefix, ``*X`` a suffix; matched ignoring case.  Documented in docs/recipe-format.md.
REFUSED_ENV: tuple[tuple[tuple[str, ...], str], ...] = (
    (("PYTHON*", "VIRTUAL_ENV", "CONDA_PREFIX"),
     "it changes the Python interpreter's startup or module search path (PYTHONPATH, "
     "PYTHONSTARTUP, PYTHONHOME, PYTHONUSERBASE, PYTHONWARNINGS import code)"),
    (("PIP_*", "UV_*"), "it changes which packages are installed, and from where"),
    (("LD_*", "DYLD_*", "*_PRELOAD", "GCONV_PATH", "OPENSSL_CONF", "OPENSSL_ENGINES",
      "OPENSSL_MODULES"),
     "it makes the dynamic loader (or a library) load other shared objects"),
    (("PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS",
      "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH",
      "GIT_*", "HOME", "XDG_CONFIG_HOME"),
     "it changes which programs run, or the startup files and configuration they read"),
    (("CC", "CXX", "CPP", "LD", "LDSHARED", "LDCXXSHARED", "AR", "CUDACXX", "CUDAHOSTCXX",
      "NVCC", "PYTORCH_NVCC", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN",
      "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CUDAFLAGS", "CMAKE_*", "CCACHE_*",
      "SCCACHE_*", "CUDA_HOME", "CUDA_PATH"),
     "it chooses the compiler, the linker, a compiler launcher or cache, or options that "
     "load compiler plugins (-fplugin, -B, -ccbin)"),
    (("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS", "TORCH_NO_COMPILER_WRAPPER",
      "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "WHEELFORGE_*"),
     "wheelforge sets it (from --arch, --jobs and the compile cache) and verifies the wheel "
     "against it"),
)


def refused_env(name: str) -> str | None:
    """Why a recipe may not set the environment variable ``name``, or None if it may."""
    upper = name.upper()
    for patterns, why in REFUSED_ENV:
        for pattern in patterns:
            if pattern.endswith("*"):
                hit = upper.startswith(pattern[:-1])
            elif pattern.startswith("*"):
                hit = upper.endswith(pattern[1:])
            else:
                hit = upper == pattern
            if hit:
                return f"(matches {pattern}) {why}" if "*" in pattern else why
    return None


# --------------------------------------------------------------------------
# schema: allowed keys per mapping, for unknown-key checks and did-you-mean

_TOP_KEYS = ("format", "name", "version", "summary", "homepage", "sources", "patches", "build",
             "verify", "test", "extract", "companions", "subsets", "project")
_SUBSET_KEYS = ("env", "values", "labels", "multiple", "help")
_SUBSET_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_SUBSET_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.]*$")
_SUBSET_LABEL = re.compile(r"^[A-Za-z0-9]*$")
_EXTRACT_KEYS = ("max-bytes", "max-members", "max-member-bytes")
_SDIST_KEYS = ("url", "filename", "sha256")
_GIT_KEYS = ("url", "commit", "tag", "release-tag", "release-commit")
_BUILD_KEYS = ("kind", "requires", "env", "local-version", "pin-torch", "drop-requires",
               "job-memory", "stable-abi")
_VERIFY_KEYS = ("imports", "requires", "stack-imports", "top-level", "excluded", "allow")
# verify.allow: a .pth file name, a start-up module, or a command name
_ALLOW = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.+-]*\.pth|sitecustomize|usercustomize|"
                    r"[A-Za-z0-9_][A-Za-z0-9_.+-]*)$")
_TEST_KEYS = ("source-files", "files", "requires")
_TEST_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*\.py$")


def _parse_source(p: Problems, entry: Any, where: str) -> Source | None:
    if not isinstance(entry, dict) or len(entry) != 1:
        p.add(where, "each source is a mapping with exactly one key, 'sdist' or 'git'")
        return None
    ((kind, body),) = entry.items()
    if kind not in ("sdist", "git"):
        hint = difflib.get_close_matches(str(kind), ["sdist", "git"], n=1)
        p.add(join(where, str(kind)),
              "unknown source kind" + (f"; did you mean '{hint[0]}'?" if hint else
                                       "; use 'sdist' or 'git'"))
        return None
    where = join(where, kind)
    if not isinstance(body, dict):
        p.add(where, "must be a mapping")
        return None
    if kind == "sdist":
        p.unknown_keys(where, body, _SDIST_KEYS)
        filename = string_field(p, body, "filename", where)
        sha = string_field(p, body, "sha256", where)
        url = string_field(p, body, "url", where, required=False)
        if filename and not _SDIST_NAME.match(filename):
            p.add(join(where, "filename"),
                  f"{filename!r} is not a source archive name (.tar.gz, .zip, ...)")
        if url and filename and url.rsplit("/", 1)[-1].split("#")[0] != filename:
            p.add(join(where, "url"), f"does not end in the file name {filename!r}")
        if sha is not None and not _HEX64.match(sha):
            p.add(join(where, "sha256"), "must be 64 lowercase hex digits")
            sha = None
        if filename and sha:
            return SdistSource(filename=filename, sha256=sha, url=url)
        return None
    p.unknown_keys(where, body, _GIT_KEYS)
    url = string_field(p, body, "url", where)
    commit = string_field(p, body, "commit", where)
    tag = string_field(p, body, "tag", where, required=False)
    release_tag = string_field(p, body, "release-tag", where, required=False)
    release_commit = string_field(p, body, "release-commit", where, required=False)
    if commit is not None and not _HEX40.match(commit):
        p.add(join(where, "commit"),
              "must be a full 40-hex commit id (a branch or tag can move; pin the commit "
              "and give the tag separately as 'tag')")
        commit = None
    if tag and (release_tag or release_commit):
        p.add(join(where, "release-tag"),
              "'tag' says the commit is the release, 'release-tag' that it comes after one: "
              "give one of them")
    if bool(release_tag) != bool(release_commit):
        p.add(join(where, "release-commit" if release_tag else "release-tag"),
              "is required with " + ("'release-tag'" if release_tag else "'release-commit'") +
              " (a tag can move: pin the release's commit beside its name)")
    if release_commit is not None and not _HEX40.match(release_commit):
        p.add(join(where, "release-commit"), "must be a full 40-hex commit id")
    elif release_commit is not None and release_commit == commit:
        p.add(join(where, "release-commit"),
              "is the pinned commit itself: a release is pinned with 'tag'")
    if url and (url.startswith("-") or any(c in url for c in "\0\n\r")):
        p.add(join(where, "url"), f"{url!r} is not a repository URL or path")
        url = None
    if url and commit:
        return GitSource(url=url, commit=commit, tag=tag, release_tag=release_tag,
                         release_commit=release_commit)
    return None


def _parse_build(p: Problems, data: Any) -> BuildSpec | None:
    where = "build"
    if not isinstance(data, dict):
        p.add(where, "is required and must be a mapping")
        return None
    p.unknown_keys(where, data, _BUILD_KEYS)
    kind = data.get("kind")
    if kind not in BUILD_KINDS:
        p.add(join(where, "kind"), f"must be one of {', '.join(BUILD_KINDS)}, got {kind!r}")
        return None
    kind = cast(BuildKind, kind)
    env_raw = data.get("env", {}) or {}
    env: list[tuple[str, str]] = []
    if not isinstance(env_raw, dict):
        p.add(join(where, "env"), "must be a mapping of variable names to strings")
    else:
        for k, v in env_raw.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                p.add(join(join(where, "env"), str(k)),
                      "is not a valid environment variable name")
            elif (why := refused_env(k)) is not None:
                p.add(join(join(where, "env"), k),
                      f"may not be set by a recipe: {why}; change the build with a patch "
                      "instead (docs/recipe-format.md, 'Build environment')")
            elif not isinstance(v, str):
                p.add(join(join(where, "env"), k),
                      f"must be a string (quote it in YAML), got {v!r}")
            else:
                env.append((k, v))
    local_version = data.get("local-version", DEFAULT_LOCAL_VERSION[kind])
    if not isinstance(local_version, str):
        p.add(join(where, "local-version"), "must be a string template")
        local_version = ""
    else:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(local_version) if f is not None}
        except ValueError as exc:
            p.add(join(where, "local-version"), f"bad template: {exc}")
            fields = set()
        unknown = sorted(fields - set(LOCAL_VERSION_FIELDS))
        if unknown:
            p.add(join(where, "local-version"),
                  f"unknown field(s) {', '.join(unknown)}; use {{cuda}}, {{cuda_major}}, "
                  "{torch}, {sm}")
        literal = re.sub(r"\{[^}]*\}", "", local_version)
        if literal and not re.fullmatch(r"[A-Za-z0-9.]*", literal):
            p.add(join(where, "local-version"), "may hold only letters, digits and '.'")
    pin_torch = data.get("pin-torch", kind == "extension")
    if not isinstance(pin_torch, bool):
        p.add(join(where, "pin-torch"), "must be true or false")
        pin_torch = False
    stable_abi = data.get("stable-abi", False)
    if not isinstance(stable_abi, bool):
        p.add(join(where, "stable-abi"), "must be true or false")
        stable_abi = False
    elif stable_abi and (kind != "extension" or pin_torch):
        p.add(join(where, "stable-abi"), "is for an extension that does not pin torch: set "
              "'pin-torch: false' (the wheel states its own 'torch>=2.N')")
    elif stable_abi and fields_of(local_version) & {"torch", "cuda"}:
        p.add(join(where, "local-version"), "a stable-ABI wheel serves every torch of its "
              "CUDA major: name {cuda_major}, not {torch} or {cuda}")
    job_memory: float | None = None
    raw_memory = data.get("job-memory")
    if raw_memory is not None:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GiB\s*", str(raw_memory)) \
            if isinstance(raw_memory, str) else None
        if m is None or not 0 < float(m.group(1)) <= 1024:
            p.add(join(where, "job-memory"), "must be the peak memory of one compile job in "
                  f"GiB, e.g. '7GiB' or '6.5GiB', got {raw_memory!r}")
        else:
            job_memory = float(m.group(1))
    return BuildSpec(
        kind=kind,
        requires=requirements(p, data, "requires", where),
        env=tuple(env),
        local_version=local_version,
        pin_torch=pin_torch,
        drop_requires=tuple(str(canonicalize_name(n)) for n in
                            string_list(p, data, "drop-requires", where)),
        job_memory_gib=job_memory,
        stable_abi=stable_abi,
    )


def _parse_verify(p: Problems, data: Any) -> VerifySpec:
    where = "verify"
    data = section(p, data, where, _VERIFY_KEYS)
    if data is None:
        return VerifySpec()
    imports = string_list(p, data, "imports", where)
    stack_imports = string_list(p, data, "stack-imports", where)
    for key, mods in (("imports", imports), ("stack-imports", stack_imports)):
        for i, mod in enumerate(mods):
            if not _MODULE.match(mod):
                p.add(join(join(where, key), i), f"{mod!r} is not a module name")
    top_level = string_list(p, data, "top-level", where)
    for i, mod in enumerate(top_level):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", mod):
            p.add(join(join(where, "top-level"), i),
                  f"{mod!r} is not a top-level module or package name")
    excluded = string_list(p, data, "excluded", where)
    for i, path in enumerate(excluded):
        if path.startswith("/") or ".." in path.split("/") or "\\" in path:
            p.add(join(join(where, "excluded"), i),
                  f"{path!r} must be a relative path inside the wheel (e.g. flash_attn/cute)")
    allow = string_list(p, data, "allow", where)
    for i, name in enumerate(allow):
        if not _ALLOW.match(name) or name.endswith((".py", ".pyc", ".so")):
            p.add(join(join(where, "allow"), i),
                  f"{name!r} is not a NAME.pth file, sitecustomize, usercustomize or a "
                  "command name (no path, no module file name)")
    return VerifySpec(imports=imports, requires=requirements(p, data, "requires", where),
                      stack_imports=stack_imports, top_level=top_level,
                      excluded=tuple(e.rstrip("/") for e in excluded), allow=allow)


def _parse_subsets(p: Problems, data: Any) -> tuple[SubsetDimension, ...]:
    where = "subsets"
    if data is None:
        return ()
    if not isinstance(data, dict) or not data:
        p.add(where, "must be a mapping of dimension names to their values")
        return ()
    out = []
    for name, body in data.items():
        at = join(where, str(name))
        if not isinstance(name, str) or not _SUBSET_NAME.match(name):
            p.add(at, "a dimension name is lowercase letters, digits and '-' (e.g. hdim)")
            continue
        if not isinstance(body, dict):
            p.add(at, "must be a mapping with env and values")
            continue
        p.unknown_keys(at, body, _SUBSET_KEYS)
        env = string_field(p, body, "env", at)
        if env is not None and (not _ENV_NAME.match(env) or refused_env(env) is not None):
            p.add(join(at, "env"), f"{env!r} is not a project switch a recipe may set "
                  "(docs/recipe-format.md, 'Build environment')")
            env = None
        values = string_list(p, body, "values", at)
        if not values:
            p.add(join(at, "values"), "is required: the values a build may hold")
        for i, v in enumerate(values):
            if not _SUBSET_VALUE.match(v):
                p.add(join(join(at, "values"), i), f"{v!r}: letters, digits and '.' only")
        if len(set(values)) != len(values):
            p.add(join(at, "values"), "lists a value twice")
        raw_labels = body.get("labels", {}) or {}
        labels: list[tuple[str, str]] = []
        if not isinstance(raw_labels, dict):
            p.add(join(at, "labels"), "must map values to label fragments")
        else:
            for v, lab in raw_labels.items():
                if str(v) not in values:
                    p.add(join(join(at, "labels"), str(v)), "is not one of the values")
                elif not isinstance(lab, str) or not _SUBSET_LABEL.match(lab):
                    p.add(join(join(at, "labels"), str(v)),
                          "must be letters and digits (it goes into the local version)")
                else:
                    labels.append((str(v), lab))
        multiple = body.get("multiple", True)
        if not isinstance(multiple, bool):
            p.add(join(at, "multiple"), "must be true or false")
            multiple = True
        help_text = body.get("help", "")
        if not isinstance(help_text, str):
            p.add(join(at, "help"), "must be a string")
            help_text = ""
        if env and values:
            out.append(SubsetDimension(name=name, env=env, values=values, labels=tuple(labels),
                                       multiple=multiple, help=help_text))
    return tuple(out)


def _parse_extract(p: Problems, data: Any) -> ExtractLimits:
    where = "extract"
    data = section(p, data, where, _EXTRACT_KEYS)
    if data is None:
        return ExtractLimits()
    values: dict[str, int] = {}
    for key in _EXTRACT_KEYS:
        if data.get(key) is None:
            continue
        count = key == "max-members"
        value = limit(data[key], count)
        if value is None:
            p.add(join(where, key), "must be a positive integer" + (
                "" if count else " (bytes) or a size such as '4GiB'") + f", got {data[key]!r}")
        else:
            values[key.replace("-", "_")] = value
    return ExtractLimits(**values)


def _gputests_dir(root: Path, name: str, project: str | None) -> Path:
    """``gputests/NAME/``; a variant recipe without one (causal-conv1d-stable,
    mamba-ssm-stable) tests its wheel with its project's files (``gputests/PROJECT/``)."""
    own = root / name
    return own if project is None or own.is_dir() else root / project


def _parse_test(p: Problems, data: Any, tests_dir: Path) -> TestSpec:
    where = "test"
    data = section(p, data, where, _TEST_KEYS)
    if data is None:
        return TestSpec()
    source_files = string_list(p, data, "source-files", where)
    for i, f in enumerate(source_files):
        if not _TEST_FILE.match(f) or ".." in f.split("/"):
            p.add(join(join(where, "source-files"), i),
                  f"{f!r} must be a relative path to a .py file in the source tree")
    files = []
    for i, f in enumerate(string_list(p, data, "files", where)):
        fpath = tests_dir / f
        if not _TEST_FILE.match(f) or ".." in f.split("/"):
            p.add(join(join(where, "files"), i), f"{f!r} must be a relative path to a .py file")
        # a missing file is wheelforge test's error, not the recipe's: a copy of recipes/
        # and patches/ without gputests/ still lists, checks and builds
        files.append(fpath)
    return TestSpec(source_files=source_files, files=tuple(files),
                    requires=requirements(p, data, "requires", where))


def parse_recipe(data: Any, path: Path, patches_dir: Path,
                 tests_dir: Path | None = None) -> Recipe:
    """Validate raw YAML data; raise :class:`RecipeError` listing every problem."""
    p = Problems(path)
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a YAML mapping",
                          fix="see docs/recipe-format.md for the format")
    p.unknown_keys("", data, _TOP_KEYS)
    fmt = data.get("format")
    if fmt is None:
        p.add("format", f"is required: format: {FORMAT_VERSION} (the recipe format version)")
    elif fmt != FORMAT_VERSION:
        p.add("format", f"must be {FORMAT_VERSION} (the recipe format version), got {fmt!r}")
    name = string_field(p, data, "name", "")
    if name and not _PROJECT_NAME.fullmatch(name):
        p.add("name", f"{name!r} is not a project name")
        name = None
    if name and canonicalize_name(name) != name:
        p.add("name", f"must be the normalized project name {canonicalize_name(name)!r}")
    if name and path.stem != name:
        p.add("name", f"{name!r} does not match the file name {path.name!r}")
    version: Version | None = None
    raw_version = data.get("version")
    if raw_version is None:
        p.add("version", "is required")
    elif not isinstance(raw_version, str):
        p.add("version", f"must be a string (quote it in YAML: '{raw_version}')")
    else:
        try:
            version = Version(raw_version)
        except InvalidVersion:
            p.add("version", f"{raw_version!r} is not a PEP 440 version")
        else:
            if version.local:
                p.add("version", "must not carry a local label; wheelforge adds one")
    summary = string_field(p, data, "summary", "", required=False) or ""
    homepage = string_field(p, data, "homepage", "", required=False)

    sources: list[Source] = []
    raw_sources = data.get("sources")
    if not isinstance(raw_sources, list) or not raw_sources:
        p.add("sources", "is required: a list of one or more pinned sources (mirrors)")
    else:
        for i, entry in enumerate(raw_sources):
            src = _parse_source(p, entry, join("sources", i))
            if src is not None:
                sources.append(src)
        if version is not None:
            for i, src in enumerate(sources):
                if isinstance(src, SdistSource) and str(version) not in src.filename:
                    p.add(join(join("sources", i), "sdist.filename"),
                          f"{src.filename!r} does not carry the recipe version {version}")
                if isinstance(src, GitSource) and src.release_tag:
                    _check_release_version(p, join(join("sources", i), "git.release-tag"),
                                           src.release_tag, version)
        _check_untagged_mirrors(p, sources)

    patches: list[Path] = []
    for i, pname in enumerate(string_list(p, data, "patches", "")):
        where = join("patches", i)
        if not _PATCH_NAME.match(pname):
            p.add(where, f"{pname!r} is not a patch file name (NAME.patch, no directories)")
            continue
        ppath = patches_dir / (name or path.stem) / pname
        if not ppath.is_file():
            p.add(where, f"patch file {ppath} does not exist")
        patches.append(ppath)
    if len(set(patches)) != len(patches):
        p.add("patches", "lists a patch twice")

    companions: list[NormalizedName] = []
    for i, cname in enumerate(string_list(p, data, "companions", "")):
        if canonicalize_name(cname) != cname:
            p.add(join("companions", i),
                  f"must be the normalized recipe name {canonicalize_name(cname)!r}")
        elif cname == name:
            p.add(join("companions", i), "a recipe cannot be its own companion")
        elif not (path.parent / f"{cname}.yaml").is_file():
            p.add(join("companions", i), f"no recipe {cname}.yaml beside this one")
        else:
            companions.append(NormalizedName(cname))
    if len(set(companions)) != len(companions):
        p.add("companions", "lists a recipe twice")

    project = _parse_project(p, data, name)
    build = _parse_build(p, data.get("build"))
    verify = _parse_verify(p, data.get("verify"))
    gputests = _gputests_dir(tests_dir or patches_dir.parent / "gputests",
                             name or path.stem, project)
    test = _parse_test(p, data.get("test"), gputests)
    limits = _parse_extract(p, data.get("extract"))
    subsets = _parse_subsets(p, data.get("subsets"))
    if subsets and build is not None and build.kind != "extension":
        p.add("subsets", "kernel subsets are for extension recipes (kind: extension)")

    if p.items:
        raise RecipeError(
            f"recipe {path} has {len(p.items)} problem(s)",
            why="\n    " + "\n    ".join(p.items),
            fix="correct the keys above; the format is described in docs/recipe-format.md",
        )
    assert name is not None and version is not None and build is not None
    return Recipe(
        name=NormalizedName(name), version=version, summary=summary, homepage=homepage,
        sources=tuple(sources), patches=tuple(patches), build=build, verify=verify, test=test,
        extract=limits, path=path, companions=tuple(companions), subsets=subsets,
        project=project,
    )


def fields_of(template: str) -> set[str]:
    """The fields a local-version template names ({cuda}, {torch}, ...); none if malformed."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f}
    except ValueError:
        return set()


def _parse_project(p: Problems, data: dict[str, Any], name: str | None) -> NormalizedName | None:
    """``project``: the wheel's project name for a variant recipe (causal-conv1d-stable
    builds causal-conv1d); the file name stays the recipe's own name."""
    project = data.get("project")
    if project is None:
        return None
    if not isinstance(project, str) or not _PROJECT_NAME.fullmatch(project):
        p.add("project", f"{project!r} is not a project name")
        return None
    if canonicalize_name(project) != project:
        p.add("project", f"must be the normalized project name {canonicalize_name(project)!r}")
        return None
    if project == name:
        p.add("project", "names the recipe itself: leave it out")
        return None
    return NormalizedName(project)


def _check_release_version(p: Problems, where: str, tag: str, version: Version) -> None:
    """The recipe's version is the release the commit descends from: its tag's version."""
    try:
        tagged = Version(tag[1:] if tag[:1] in "vV" else tag)
    except InvalidVersion:
        p.add(where, f"{tag!r} does not name a PEP 440 version; the recipe version must be "
                     "the release's")
        return
    if tagged != version:
        p.add(where, f"the release {tag} is version {tagged}, the recipe says {version}; "
                     "the recipe version of a commit after a release is that release's")


def _check_untagged_mirrors(p: Problems, sources: Sequence[Source]) -> None:
    """Mirrors carry the same bytes: a commit after a release has no sdist, and every
    git mirror pins the same commit."""
    untagged = [s for s in sources if isinstance(s, GitSource) and s.release_tag]
    if not untagged:
        return
    for i, src in enumerate(sources):
        if isinstance(src, SdistSource):
            p.add(join(join("sources", i), "sdist"),
                  "an sdist is a release's bytes, not those of the commit after it; mirrors "
                  "of an untagged commit are git repositories only")
        elif src.commit != untagged[0].commit:
            p.add(join(join("sources", i), "git.commit"),
                  "every mirror must pin the same commit")


def load_recipe(path: Path, patches_dir: Path) -> Recipe:
    data = read_yaml(path, RecipeError, f"recipe {path}")
    return parse_recipe(data, path, patches_dir)


@dataclass(frozen=True)
class RecipeBook:
    """The recipes directory and the patches directory beside it."""

    recipes_dir: Path
    patches_dir: Path

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.recipes_dir.glob("*.yaml"))

    def path_for(self, name: str) -> Path:
        """``RECIPES/NAME.yaml`` for a project name; a name is never a path: anything but a
        project name (``/some/dir/x``, ``../x``, ``x.yaml``) is a RecipeError."""
        if not _PROJECT_NAME.fullmatch(name):
            raise RecipeError(
                f"{name!r} is not a project name",
                why="a recipe is named by its project name (letters, digits and '-', '_', "
                    "'.' between them, as on PyPI), never by a path or a file name",
                fix=f"give the name alone, e.g. 'causal-conv1d'; to use another recipes "
                    f"directory pass --recipes DIR (now {self.recipes_dir})")
        return self.recipes_dir / f"{canonicalize_name(name)}.yaml"

    def load(self, name: str) -> Recipe:
        path = self.path_for(name)
        if not path.is_file():
            known = self.names()
            hint = difflib.get_close_matches(str(canonicalize_name(name)), known, n=1)
            raise RecipeError(
                f"no recipe named {name!r} in {self.recipes_dir}",
                why=f"known recipes: {', '.join(known) or '(none)'}",
                fix=(f"did you mean '{hint[0]}'?" if hint else
                     "run 'wheelforge list', or write recipes/NAME.yaml"),
            )
        return load_recipe(path, self.patches_dir)

    def load_each(self) -> tuple[list[Recipe], list[tuple[Path, RecipeError]]]:
        """Every recipe that loads, and each broken one's file and error."""
        recipes: list[Recipe] = []
        broken: list[tuple[Path, RecipeError]] = []
        for name in self.names():
            path = self.recipes_dir / f"{name}.yaml"
            try:
                recipes.append(load_recipe(path, self.patches_dir))
            except RecipeError as exc:
                broken.append((path, exc))
        return recipes, broken

    def load_all(self) -> list[Recipe]:
        """Load every recipe; raise one error listing every broken recipe's problems."""
        recipes, broken = self.load_each()
        if broken:
            raise broken_recipes(broken)
        return recipes


def problem_lines(path: Path, exc: RecipeError) -> list[str]:
    """A broken recipe's problems, one line each, every one naming the file."""
    text = (exc.why or exc.what).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and not all(line.startswith(str(path)) for line in lines):
        lines = ["; ".join(lines)]  # one problem told on several lines
    return [line if line.startswith(str(path)) else f"{path}: {line}" for line in lines]


def broken_recipes(broken: Sequence[tuple[Path, RecipeError]]) -> RecipeError:
    """One error for every broken recipe: each problem on a line of its own."""
    lines = [line for path, exc in broken for line in problem_lines(path, exc)]
    return RecipeError(f"{len(broken)} recipe(s) have problems",
                       why="\n    " + "\n    ".join(lines),
                       fix="correct the keys above; see docs/recipe-format.md")
