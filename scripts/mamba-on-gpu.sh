#!/usr/bin/env bash
# mamba-ssm on a GPU machine without network: build it (and its companion causal-conv1d)
# against the machine's own python/torch into an index there, then prove it as a user
# installs it: `wheelforge test mamba-ssm` (upstream's tests/ops/test_selective_scan.py from
# the pinned tree and gputests/mamba-ssm/), and a tiny Mamba-2 hybrid from the machine's
# transformers taking the fast path, shown by kernel name (gputests/stack/hybrid_models.py).
#
#   scripts/mamba-on-gpu.sh PAYLOAD OUT_DIR
#
# PAYLOAD holds src/ recipes/ patches/ gputests/ scripts/ of wheelforge, sdists/ (the
# causal-conv1d sdist), state-spaces-mamba.bundle, and wheels/ (runtime packages the
# machine lacks, installed first without their dependencies).  The build runs detached
# (setsid) and the script waits up to $BUDGET seconds (default 540); run it again to pick
# up a build still running.  ARCH (default: this GPU's), JOBS (default: cores).
set -uo pipefail
W=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
py=$(command -v python3)
export PYTHONPATH=$W/src PYTHONUNBUFFERED=1
st=/tmp/wf-mamba; mkdir -p "$st"
url=https://github.com/state-spaces/mamba
mirror="$url=$W/state-spaces-mamba.bundle"
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
arch=${ARCH:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
jobs=${JOBS:-$(nproc)}

if [ ! -e "$st/build.started" ]; then
  touch "$st/build.started"
  if ls "$W"/wheels/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --disable-pip-version-check "$W"/wheels/*.whl \
      > "$st/wheels.log" 2>&1 || { cat "$st/wheels.log"; exit 2; }
  fi
  date +%s > "$st/build.t0"
  setsid nohup bash -c "'$py' -m wheelforge build mamba-ssm --recipes '$W/recipes' \
    --python '$py' --arch '$arch' -j $jobs --index '$st/index' --cache-dir '$st/cache' \
    --work-dir '$st/work' --sources '$W/sdists' --git-mirror '$mirror' > '$st/build.log' 2>&1;
    echo \$? > '$st/build.rc'; date +%s > '$st/build.t1'" > /dev/null 2>&1 &
  # each build's .ninja_log, copied as it grows (the work directory goes once published):
  # the compile time of every translation unit
  setsid nohup bash -c "until [ -e '$st/build.rc' ]; do
    for f in '$st'/work/*/src/*/build/*/.ninja_log; do
      [ -f \"\$f\" ] && cp \"\$f\" \"$st/ninja-\$(basename \$(dirname \$(dirname \$(dirname \$(dirname \"\$f\")))) | cut -d- -f1-2).log\";
    done; sleep 1; done" > /dev/null 2>&1 &
fi
while [ ! -e "$st/build.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 3; done
cp "$st"/build.log "$st"/ninja-*.log "$out"/ 2>/dev/null
if [ ! -e "$st/build.rc" ]; then
  echo "build still running after $(( $(date +%s) - $(cat "$st/build.t0") )) s:"; tail -3 "$st/build.log"
  exit 3
fi
echo "build exit $(cat "$st/build.rc"), wall $(( $(cat "$st/build.t1") - $(cat "$st/build.t0") )) s (both recipes)"
grep -E "^(published|already published|install):|ok compile|ok fetch|mirror of" "$st/build.log"
[ "$(cat "$st/build.rc")" = 0 ] || { tail -40 "$st/build.log"; exit 4; }
for whl in "$st"/index/files/*.whl; do "$py" -m wheelforge inspect "$whl"; done > "$out/inspect.txt" 2>&1
cat "$out/inspect.txt"

rc=0
# a user's venv, layered on the machine's python (torch, transformers, triton, einops there):
# mamba-ssm from the index, and the causal-conv1d build it pins; without their other
# dependencies when NO_DEPS=1 (a machine that cannot have all of them: pip check lists them)
v=$st/venv/bin/python
if [ ! -x "$v" ]; then
  "$py" -m venv "$st/venv"
  # layered on python3's own packages (python3 may itself be a venv, which
  # --system-site-packages would skip)
  "$py" -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$v" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-base.pth"
  mv=$(basename "$st"/index/files/mamba_ssm-*.whl | cut -d- -f2)
  if [ "${NO_DEPS:-0}" = 1 ]; then
    cv=$("$st/venv/bin/python" -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
print([l.split('==')[1] for l in z.read([n for n in z.namelist() if n.endswith('METADATA')][0]).decode().splitlines() \
if l.startswith('Requires-Dist: causal-conv1d==') and ';' not in l][0])" "$st"/index/files/mamba_ssm-*.whl)
    "$v" -m pip install -q --disable-pip-version-check --no-deps --index-url \
      "file://$st/index/simple" "mamba-ssm==$mv" "causal-conv1d==$cv" > "$out/pip.log" 2>&1 || rc=1
  else
    "$v" -m pip install -q --disable-pip-version-check --index-url "file://$st/index/simple" \
      "mamba-ssm==$mv" > "$out/pip.log" 2>&1 || rc=1
  fi
  "$v" -m pip check >> "$out/pip.log" 2>&1
  "$v" -m pip list 2>/dev/null | grep -iE "^(mamba|causal|torch |transformers|triton)" >> "$out/pip.log"
  cat "$out/pip.log"
fi
if [ ! -e "$st/test.done" ]; then
  # upstream's test file from the pinned commit, and gputests/mamba-ssm/, against the venv
  mkdir -p "$st/tests" && git init -q "$st/up" && git -C "$st/up" fetch -q \
    "$W/state-spaces-mamba.bundle" 'refs/heads/*:refs/heads/*' 'refs/tags/*:refs/tags/*'
  git -C "$st/up" show e9594ce1c732d97440f0332fdc43170a2294dbfa:tests/ops/test_selective_scan.py \
    > "$st/tests/test_selective_scan.py"
  cp "$W/gputests/mamba-ssm/"*.py "$st/tests/"
  (cd "$st/tests" && export PYTHONNOUSERSITE=1 &&
    "$v" -m pytest -q -p no:cacheprovider -n 8 test_selective_scan.py &&
    "$v" -m pytest -q -p no:cacheprovider -s test_mamba2_block.py) > "$out/test.log" 2>&1 || rc=1
  touch "$st/test.done"
  grep -E "^mamba2 |passed|failed|error" "$out/test.log" | tail -8
fi
"$v" -c "import torch, selective_scan_cuda, causal_conv1d_cuda, mamba_ssm; \
print('imports ok', mamba_ssm.__file__)" || rc=1
"$v" "$W/gputests/stack/hybrid_models.py" "$st/hybrid" || rc=1
cp "$st/hybrid/hybrids.json" "$out/" 2>/dev/null
exit $rc
