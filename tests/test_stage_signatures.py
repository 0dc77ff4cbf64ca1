"""Builder identity you can check: `--require-reproduced N` counts builders the
publisher trusts, not stages that say so (issue 52).

Confirmed on the old code: a stage copied with its cell.json `host` field edited counted as
a second builder.  Now each builder signs its stage with its SSH key (ssh-keygen -Y sign,
real keys generated here) and the publisher counts the distinct principals its
allowed-signers file gives the verified keys.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from test_nightly import wheelforge
from test_publisher_verifies import _publish, _published, _refused, _stage
from wheelforge.errors import ConfigError, VerifyError
from wheelforge.nightly import signing

pytestmark = pytest.mark.usefixtures("keygen")


@pytest.fixture(scope="module")
def keygen() -> str:
    return require_tool("ssh-keygen")


def key(root: Path, name: str) -> Path:
    """A fresh ed25519 key pair ROOT/keys/NAME(.pub), made by ssh-keygen."""
    path = root / "keys" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", path],
                   check=True, timeout=60)
    return path


def allowed(root: Path, **keys: Path) -> Path:
    """An allowed_signers file trusting each NAME=KEY."""
    path = root / "allowed_signers"
    path.write_text("".join(
        f'{name} namespaces="{signing.NAMESPACE}" {key.with_suffix(".pub").read_text()}'
        for name, key in keys.items()))
    return path


def signed_copy(src: Path, dest: Path, host: str, by: Path | None) -> Path:
    """``src`` copied with its host field edited (the attack), then signed with ``by``."""
    shutil.copytree(src, dest)
    for f in (signing.MANIFEST, signing.SIGNATURE):
        (dest / f).unlink(missing_ok=True)
    record = json.loads((dest / "cell.json").read_text())
    (dest / "cell.json").write_text(json.dumps({**record, "host": host}))
    if by is not None:
        signing.sign_stage(dest, by)
    return dest


def test_one_key_twice_is_one_builder_and_two_keys_are_two(tmp_path: Path) -> None:
    a_key, b_key = key(tmp_path, "a"), key(tmp_path, "b")
    trust = allowed(tmp_path, **{"builder-a": a_key, "builder-b": b_key})
    a, wheel = _stage(tmp_path, "a/cell-0", host="builder-a:/cache")
    signing.sign_stage(a, a_key)
    # the attack: the same builder's stage copied, host edited, signed again by the same key
    copy = signed_copy(a, tmp_path / "stages" / "b" / "cell-0", "builder-b:/cache", a_key)
    res = _publish(tmp_path, tmp_path / "stages", "--require-reproduced", "2",
                   "--allowed-signers", trust)
    _refused(res, 1, "built by 1 trusted builder(s), --require-reproduced asks for 2")
    assert _published(tmp_path) == []
    # an unsigned copy with its host edited counts as no builder, and the report says so
    shutil.rmtree(copy)
    signed_copy(a, copy, "builder-b:/cache", None)
    res = _publish(tmp_path, tmp_path / "stages", "--require-reproduced", "2",
                   "--allowed-signers", trust)
    _refused(res, 1, "built by 1 trusted builder(s)",
             "1 stage(s) unsigned or signed by no allowed signer count as no builder",
             f"{copy}: sha256 ", "unsigned or unverified: no builder")
    assert _published(tmp_path) == []
    # a second builder, with its own key, that staged the same bytes: published
    shutil.rmtree(copy)
    signed_copy(a, copy, "builder-b:/cache", b_key)
    res = _publish(tmp_path, tmp_path / "stages", "--require-reproduced", "2",
                   "--allowed-signers", trust)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _published(tmp_path) == [wheel.name]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert "signed by builder-a" in report["cells"][0]["note"]


def test_builders_that_disagree_are_named_by_their_signers(tmp_path: Path) -> None:
    a_key, b_key = key(tmp_path, "a"), key(tmp_path, "b")
    trust = allowed(tmp_path, **{"builder-a": a_key, "builder-b": b_key})
    a, _ = _stage(tmp_path, "a/cell-0")
    b, _ = _stage(tmp_path, "b/cell-0", payload="VALUE = 2\n")
    signing.sign_stage(a, a_key)
    signing.sign_stage(b, b_key)
    res = _publish(tmp_path, tmp_path / "stages", "--require-reproduced", "2",
                   "--allowed-signers", trust)
    _refused(res, 1, "the builders disagree: 2 different wheels from 2 stage(s) of 2 "
             "trusted builder(s)", "signed by builder-a", "signed by builder-b")
    assert _published(tmp_path) == []


def test_a_stage_changed_after_signing_is_refused(tmp_path: Path) -> None:
    a_key = key(tmp_path, "a")
    trust = allowed(tmp_path, **{"builder-a": a_key})
    stage, wheel = _stage(tmp_path, "cell-0")
    signing.sign_stage(stage, a_key)
    record = json.loads((stage / "cell.json").read_text())
    (stage / "cell.json").write_text(json.dumps({**record, "host": "builder-b:/cache"}))
    for extra in ([], ["--allowed-signers", trust]):  # refused with or without the list
        res = _publish(tmp_path, stage, *extra)
        _refused(res, 8, "its files are not the ones its builder signed",
                 "cell.json: changed after signing", "nothing was published")
    assert _published(tmp_path) == []
    # a manifest rewritten to match, without the key: the signature does not verify
    (stage / signing.MANIFEST).write_text(signing.manifest(stage))
    res = _publish(tmp_path, stage, "--allowed-signers", trust)
    _refused(res, 8, "its signature does not verify for builder-a")
    # half a signature
    (stage / signing.SIGNATURE).unlink()
    _refused(_publish(tmp_path, stage), 8, f"it lacks {signing.SIGNATURE}")
    assert _published(tmp_path) == []
    # a file added after signing
    stage2, _ = _stage(tmp_path, "other/cell-0")
    signing.sign_stage(stage2, a_key)
    (stage2 / "extra.py").write_text("x")
    _refused(_publish(tmp_path, stage2, "--allowed-signers", trust), 8,
             "extra.py: added after signing")
    assert wheel.is_file()


def test_an_unknown_signer_is_refused(tmp_path: Path) -> None:
    a_key, stranger = key(tmp_path, "a"), key(tmp_path, "stranger")
    trust = allowed(tmp_path, **{"builder-a": a_key})
    stage, _ = _stage(tmp_path, "cell-0")
    signing.sign_stage(stage, stranger)
    res = _publish(tmp_path, stage, "--allowed-signers", trust)
    _refused(res, 8, "its signer is not one the publisher trusts",
             f"the key that signed {signing.SIGNATURE} is not in {trust}")
    assert _published(tmp_path) == []
    # a key listed for another namespace is no signer of stages either
    (tmp_path / "ns").write_text(f'builder-a namespaces="git" '
                                 f'{stranger.with_suffix(".pub").read_text()}')
    _refused(_publish(tmp_path, stage, "--allowed-signers", tmp_path / "ns"), 8,
             "its signature does not verify for builder-a",
             'not permitted for use in signature namespace "wheelforge-stage"')


def test_unsigned_stages_publish_as_before_and_say_so(tmp_path: Path) -> None:
    stage, wheel = _stage(tmp_path, "cell-0")
    res = _publish(tmp_path, stage)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _published(tmp_path) == [wheel.name]
    report = json.loads((tmp_path / "index" / "reports" / "nightly-latest.json").read_text())
    assert "unsigned stage" in report["cells"][0]["note"]


def test_require_reproduced_needs_an_allowed_signers_file(tmp_path: Path) -> None:
    stage, _ = _stage(tmp_path, "cell-0")
    res = _publish(tmp_path, stage, "--require-reproduced", "1")
    _refused(res, ConfigError.exit_code, "counts builders the publisher trusts",
             "pass --allowed-signers FILE")
    # one trusted builder is enough for N=1; an unsigned stage is not
    a_key = key(tmp_path, "a")
    trust = allowed(tmp_path, **{"builder-a": a_key})
    _refused(_publish(tmp_path, stage, "--require-reproduced", "1", "--allowed-signers",
                      trust), 1, "built by 0 trusted builder(s)")
    signing.sign_stage(stage, a_key)
    res = _publish(tmp_path, stage, "--require-reproduced", "1", "--allowed-signers", trust)
    assert res.returncode == 0, res.stderr[-3000:]


def test_nightly_run_checks_the_key_before_building(tmp_path: Path) -> None:
    """A key ssh-keygen cannot sign with fails `nightly run` at once, with a clear error
    (a world-readable private key: ssh-keygen refuses it)."""
    bad = key(tmp_path, "loose")
    bad.chmod(0o644)
    with pytest.raises(ConfigError, match="cannot sign with the key") as err:
        signing.check_key(bad)
    assert "passphrase" in str(err.value.fix)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": 1, "cells": [], "done": []}))
    res = wheelforge("nightly", "run", "--plan", plan, "--cell", "0", "--stage-dir",
                     tmp_path / "s", "--signing-key", tmp_path / "missing", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "--signing-key" in res.stderr


def test_a_control_character_in_a_file_name_refuses_the_stage(tmp_path: Path) -> None:
    stage, _ = _stage(tmp_path, "cell-0")
    (stage / "x\n0000  cell.json").write_text("")
    with pytest.raises(VerifyError, match="it holds a file named") as err:
        signing.manifest(stage)
    assert "a control character" in str(err.value.why)


def test_without_ssh_keygen_the_error_says_so(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    a_key = key(tmp_path, "a")
    stage, _ = _stage(tmp_path, "cell-0")
    signing.sign_stage(stage, a_key)
    trust = allowed(tmp_path, **{"builder-a": a_key})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="ssh-keygen did not run") as err:
        signing.verify_stage(stage, trust)
    assert "install OpenSSH" in str(err.value.fix)


@pytest.mark.e2e
def test_two_real_builders_sign_and_the_publisher_counts_them(tmp_path: Path,
                                                              shared_cache: Path) -> None:
    """The real commands: one pure cell built twice by `nightly run --signing-key` (two
    builders, two keys, the second through WHEELFORGE_SIGNING_KEY), published with
    `--require-reproduced 2 --allowed-signers`."""
    from test_fanout import _common, _plan, _project
    from test_nightly import clean_env

    _project(tmp_path, ["purea"])
    (cell,) = _plan(tmp_path, shared_cache)["cells"]
    keys = {"builder-a": key(tmp_path, "a"), "builder-b": key(tmp_path, "b")}
    for n, (name, path) in enumerate(keys.items()):
        env = clean_env()
        args: list[str | Path] = []
        if n:
            env["WHEELFORGE_SIGNING_KEY"] = str(path)
        else:
            args = ["--signing-key", path]
        res = wheelforge("nightly", "run", "--plan", tmp_path / "plan.json", "--cell",
                         str(cell["id"]), "--stage-dir", tmp_path / "stages" / name,
                         *_common(tmp_path, shared_cache), "--sources", tmp_path / "sdists",
                         "--work-dir", tmp_path / f"work-{name}", *args, cwd=tmp_path,
                         env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        stage = tmp_path / "stages" / name / f"cell-{cell['id']}"
        assert (stage / signing.SIGNATURE).is_file()
        assert json.loads((stage / "cell.json").read_text())["log"] in ("build.log", None)
    trust = allowed(tmp_path, **keys)
    res = wheelforge("nightly", "publish", "--plan", tmp_path / "plan.json",
                     tmp_path / "stages", "--index", tmp_path / "index", "--cache-dir",
                     tmp_path / "publisher-cache", "--require-reproduced", "2",
                     "--allowed-signers", trust, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [p.name for p in (tmp_path / "index" / "files").glob("*.whl")] == [
        "purea-0.1.0+wf-py3-none-any.whl"]
