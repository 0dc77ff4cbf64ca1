"""The content rules see every file a wheel installs (issue 52, the publisher).

Each attack was confirmed on the old code: the rules skipped the wheel's ``NAME.data/``
tree (``purelib/evil.pth`` and ``scripts/pip`` passed), a ``NAME.pth`` passed a
``top-level: [NAME]`` rule, and a recipe without a top-level rule (every shipped one but
flash-attn) let ``sitecustomize.py`` or ``evil.pth`` through.  Here each is refused, at
the build's verification and at the publisher, for every recipe, unless the recipe's
``verify.allow`` names it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, make_wheel
from test_nightly import wheelforge
from test_publisher_verifies import VERSION, _plan, _published, _refused, _write_record
from test_recipe import GOOD, book, problems
from wheelforge.builder.artifact.verify import content_problems
from wheelforge.recipe.format import RecipeBook

DATA = f"demo-{VERSION}.data"
BASE = {"demo/__init__.py": "X = 1\n"}


def _problems(tmp_path: Path, files: dict[str, str | bytes], *, top_level: tuple[str, ...] = (),
              excluded: tuple[str, ...] = (), allow: tuple[str, ...] = ()) -> list[str]:
    wheel = make_wheel(tmp_path / "w", {**BASE, **files}, name="demo", version=VERSION)
    return content_problems(wheel, top_level, excluded, allow)


ATTACKS = {
    "data purelib .pth": ({f"{DATA}/purelib/evil.pth": "import os\n"}, "evil.pth is a .pth"),
    "data platlib .pth": ({f"{DATA}/platlib/evil.pth": "import os\n"}, "evil.pth is a .pth"),
    "data scripts pip": ({f"{DATA}/scripts/pip": "#!/bin/sh\n"},
                         "installs the command 'pip' on PATH: shadows"),
    "data scripts other": ({f"{DATA}/scripts/demo-tool": "#!/bin/sh\n"},
                           "a command the recipe does not declare"),
    "top-level sitecustomize": ({"sitecustomize.py": "import os\n"},
                                "installs the module sitecustomize"),
    "sitecustomize package": ({"sitecustomize/__init__.py": ""},
                              "installs the module sitecustomize"),
    "usercustomize .so": ({"usercustomize.cpython-311-x86_64-linux-gnu.so": b"\x7fELF"},
                          "installs the module usercustomize"),
    "sitecustomize .pyc": ({"__pycache__/sitecustomize.cpython-311.pyc": b"\0"},
                           "installs the module sitecustomize"),
    "sitecustomize via purelib": ({f"{DATA}/purelib/sitecustomize.py": ""},
                                  "installs the module sitecustomize"),
    "top-level evil.pth": ({"evil.pth": "import os\n"}, "evil.pth is a .pth"),
    "data into site-packages": (
        {f"{DATA}/data/lib/python3.11/site-packages/evil.pth": "import os\n"},
        "evil.pth is a .pth"),
    "data into dist-packages": (
        {f"{DATA}/data/local/lib/python3.11/dist-packages/evil.pth": "import os\n"},
        "evil.pth is a .pth"),
    "data into bin": ({f"{DATA}/data/bin/python": "#!/bin/sh\n"},
                      "installs the command 'python' on PATH"),
    "data into the stdlib": ({f"{DATA}/data/lib/python3.11/os.py": ""},
                             "installs into the interpreter's standard library"),
    "console script": ({f"demo-{VERSION}.dist-info/entry_points.txt":
                        "[console_scripts]\npip = demo:main\n"},
                       "installs the command 'pip' on PATH: shadows"),
    "gui script": ({f"demo-{VERSION}.dist-info/entry_points.txt":
                    "[gui_scripts]\ndemo-gui = demo:main\n"},
                   "installs the command 'demo-gui'"),
    "foreign metadata": ({f"{DATA}/purelib/pytest_evil-1.0.dist-info/entry_points.txt":
                          "[pytest11]\nevil = demo\n"},
                         "another distribution's metadata"),
    "egg-info at the top": ({"evil.egg-info/entry_points.txt": "[pytest11]\nevil = demo\n"},
                            "another distribution's metadata"),
    "unknown scheme": ({f"{DATA}/lib/x.py": ""}, "an unknown .data scheme 'lib'"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_installed_file_is_checked_for_every_recipe(tmp_path: Path, attack: str) -> None:
    files, needle = ATTACKS[attack]
    found = _problems(tmp_path, files)
    assert any(needle in p for p in found), found


def test_a_name_pth_passes_no_top_level_rule(tmp_path: Path) -> None:
    """The old rule took `demo.pth` for the module demo."""
    found = _problems(tmp_path, {"demo.pth": "import os; os.system('id')\n"},
                      top_level=("demo",))
    assert found == ["demo.pth: demo.pth is a .pth file at the top of site-packages: its "
                     "import lines run at every interpreter start (allow it by name in "
                     "verify.allow)"]


def test_the_rules_apply_to_where_data_files_install(tmp_path: Path) -> None:
    found = _problems(tmp_path, {f"{DATA}/purelib/hopper/__init__.py": "",
                                 f"{DATA}/platlib/demo/cute/k.py": ""},
                      top_level=("demo",), excluded=("demo/cute",))
    assert any("recipe does not ship: hopper" in p for p in found), found
    assert any("demo/cute is in the wheel (1 file(s), e.g. "
               f"{DATA}/platlib/demo/cute/k.py)" in p for p in found), found
    # a top-level file that is no module is named whole, not cut at its first dot
    found = _problems(tmp_path, {"demo.sh": "x"}, top_level=("demo",))
    assert any("does not ship: demo.sh" in p for p in found), found


def test_what_the_recipe_allows_by_name_passes(tmp_path: Path) -> None:
    files = {"demo.pth": "import demo\n", "sitecustomize.py": "",
             f"{DATA}/scripts/demo-tool": "#!/bin/sh\n",
             f"demo-{VERSION}.dist-info/entry_points.txt":
                 "[console_scripts]\ndemo-run = demo:main\n"}
    assert _problems(tmp_path, files, top_level=("demo",),
                     allow=("demo.pth", "sitecustomize", "demo-tool", "demo-run")) == []
    # allowing one leaves the others refused
    left = _problems(tmp_path, files, allow=("demo.pth",))
    assert len(left) == 3, left


def test_an_honest_wheel_passes(tmp_path: Path) -> None:
    """Packages, extension modules, headers, data under share/, pth-looking files deep
    in a package (site.py reads only the top) and other entry point groups pass."""
    assert _problems(tmp_path, {
        "demo/_C.cpython-311-x86_64-linux-gnu.so": b"\x7fELF", "demo_cuda.abi3.so": b"",
        "demo/data/notes.pth": "", f"{DATA}/headers/demo.h": "",
        f"{DATA}/data/share/demo/x.json": "{}", f"{DATA}/purelib/demo/extra.py": "",
        f"demo-{VERSION}.dist-info/entry_points.txt": "[demo.plugins]\nx = demo:x\n"},
        top_level=("demo", "demo_cuda")) == []


def test_the_shipped_recipes_allow_nothing_and_their_wheels_pass(tmp_path: Path) -> None:
    """No shipped recipe ships a .pth, a start-up module or a command (their setup.py and
    pyproject declare no entry points, scripts or data files): the layout of each
    recipe's wheel passes the rules that are now on for every recipe."""
    shipped = RecipeBook(REPO / "recipes", REPO / "patches")
    layouts = {"causal-conv1d": ["causal_conv1d", "causal_conv1d_cuda"],
               "causal-conv1d-stable": ["causal_conv1d", "causal_conv1d_cuda"],
               "flash-attn": ["flash_attn", "flash_attn_2_cuda"],
               "mamba-ssm": ["mamba_ssm", "selective_scan_cuda"],
               "mamba-ssm-stable": ["mamba_ssm", "selective_scan_cuda"],
               "fla-core": ["fla"], "flash-linear-attention": ["fla"]}
    assert sorted(layouts) == shipped.names()
    for name, tops in layouts.items():
        r = shipped.load(name)
        assert r.verify.allow == ()
        files: dict[str, str | bytes] = {}
        for top in tops:
            if top.endswith("_cuda"):
                files[f"{top}.cpython-311-x86_64-linux-gnu.so"] = b"\x7fELF"
            else:
                files[f"{top}/__init__.py"] = ""
        wheel = make_wheel(tmp_path / name, files, name=r.project or name,
                           version=str(r.version))
        assert content_problems(wheel, r.verify.top_level, r.verify.excluded,
                                r.verify.allow) == [], name


def test_the_publisher_refuses_a_data_pth(tmp_path: Path) -> None:
    """Through `wheelforge nightly publish`: a stage whose wheel installs evil.pth from
    its .data/purelib is refused (exit 8, nothing published), for a recipe with no
    content rules at all; the plan's verify.allow lets the same wheel through."""
    stage = tmp_path / "stages" / "cell-0"
    wheel = make_wheel(stage, {**BASE, f"{DATA}/purelib/evil.pth": "import os\n",
                               f"{DATA}/scripts/pip": "#!/bin/sh\n"},
                       name="demo", version=VERSION)
    _write_record(stage, wheel)
    res = wheelforge("nightly", "publish", "--plan", _plan(tmp_path), "--index",
                     tmp_path / "index", "--cache-dir", tmp_path / "cache", stage,
                     cwd=tmp_path)
    _refused(res, 8, "failed the publisher's verification (2 problem(s))",
             "evil.pth is a .pth file", "installs the command 'pip' on PATH")
    assert _published(tmp_path) == []
    plan = _plan(tmp_path, allow=["evil.pth", "pip"])
    assert json.loads(plan.read_text())["cells"][0]["allow"] == ["evil.pth", "pip"]
    res = wheelforge("nightly", "publish", "--plan", plan, "--index", tmp_path / "index",
                     "--cache-dir", tmp_path / "cache", stage, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _published(tmp_path) == [wheel.name]


def test_verify_allow_is_validated(tmp_path: Path) -> None:
    ok = book(tmp_path, GOOD + "  allow: [demo.pth, sitecustomize, demo-tool]\n").load("demo")
    assert ok.verify.allow == ("demo.pth", "sitecustomize", "demo-tool")
    for bad in ("../x.pth", "bin/pip", "sitecustomize.py", "x y"):
        why = problems(tmp_path, GOOD + f"  allow: [{json.dumps(bad)}]\n")
        assert "verify.allow[0]" in why and "is not a NAME.pth file" in why, why
