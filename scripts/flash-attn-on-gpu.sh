#!/usr/bin/env bash
# flash-attn on a GPU machine without network, proven as a user takes it:
#  1. `wheelforge build flash-attn` against the machine's own python/torch (SUBSET, default
#     hdim=64,128,256: both dtypes, forward, backward and split-kv; SUBSET=full: the whole
#     single-arch wheel, every kernel), timed (wall and CPU);
#  2. with SMALL=1, the model subset (hdim=128, dtype=bf16, forward and backward) built
#     beside the tests, timed: the "one model's kernels" build;
#  3. a venv layered on the machine's python, flash-attn installed from the index with pip
#     (its dependencies resolved against what the python holds);
#  4. upstream's tests/test_flash_attn.py from the pinned sdist, sliced by
#     gputests/flash-attn/upstream_slice.py, and gputests/flash-attn/test_flash_attn_func.py
#     (wheelforge's own: the subset's refusals of what it did not build);
#  5. a transformers Llama with flash_attention_2 against sdpa
#     (gputests/flash-attn/attention_model.py).
#
#   scripts/flash-attn-on-gpu.sh PAYLOAD OUT_DIR
#
# PAYLOAD holds sdists/ (the flash-attn sdist) and wheels/ (wheelforge's runtime packages
# and test tools the machine lacks, put on PYTHONPATH). Each step runs detached (setsid);
# the script waits up to $BUDGET seconds (default 540): run it again to pick up where it
# is. ARCH (default: this GPU's), JOBS (default: cores), SUBSET, SMALL; FA_SLICE_HDIMS
# (gputests/flash-attn/upstream_slice.py) should name the head dims SUBSET builds.
set -uo pipefail
W=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3)
st=/tmp/wf-fa; mkdir -p "$st"
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
. "$repo/scripts/gpu-common.sh"
gpu_site "$py" "$W/wheels" "$st" || exit 2
export PYTHONPATH=$repo/src:$st/site
arch=${ARCH:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
jobs=${JOBS:-$(nproc)}
subset=${SUBSET:-hdim=64,128,256}

detached() {  # NAME COMMAND...: run once, in the background, recording NAME.rc and times
  local name=$1; shift
  [ -e "$st/$name.started" ] && return 0
  touch "$st/$name.started"; date +%s > "$st/$name.t0"
  # `times`: the CPU seconds (user, system) of the shell's children, the command's tree
  setsid nohup bash -c '"$@" > "'"$st/$name.log"'" 2>&1; echo $? > "'"$st/$name.rc"'"
    date +%s > "'"$st/$name.t1"'"; times > "'"$st/$name.times"'"' \
    _ "$@" > /dev/null 2>&1 &
}
wait_for() {  # NAME: 0 when done, 3 when still running at the deadline
  while [ ! -e "$st/$1.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 3; done
  cp "$st/$1.log" "$out/" 2>/dev/null
  if [ ! -e "$st/$1.rc" ]; then
    echo "$1 still running after $(( $(date +%s) - $(cat "$st/$1.t0") )) s:"
    tail -2 "$st/$1.log"; return 3
  fi
  echo "$1 exit $(cat "$st/$1.rc"), wall $(( $(cat "$st/$1.t1") - $(cat "$st/$1.t0") )) s," \
    "CPU (user system) $(tail -1 "$st/$1.times" 2>/dev/null)"
}
build() {  # NAME INDEX SUBSET-ARGS...
  local name=$1 idx=$2; shift 2
  detached "$name" "$py" -m wheelforge build flash-attn --recipes "$repo/recipes" \
    --python "$py" --arch "$arch" -j "$jobs" --index "$idx" --cache-dir "$st/cache" \
    --work-dir "$st/work-$name" --sources "$W/sdists" --no-stack-check "$@"
}

args=(); IFS=' ' read -ra parts <<< "$subset"
[ "$subset" = full ] && parts=()
for s in "${parts[@]}"; do args+=(--subset "$s"); done
[ -e "$out/machine.txt" ] || { nproc; nvidia-smi -L; cat /proc/loadavg; free -g | head -2; } > "$out/machine.txt" 2>&1
build big "$st/index" "${args[@]}"
wait_for big || exit 3
grep -E "^(published|already published)|ok compile" "$st/big.log"
ls -la "$st"/index/files/ 2>/dev/null | grep -i flash
[ "$(cat "$st/big.rc")" = 0 ] || { tail -40 "$st/big.log"; exit 4; }
# with SMALL=1, the model's subset compiles beside the tests (CPU against GPU work)
[ "${SMALL:-0}" = 1 ] && build small "$st/index-small" --subset hdim=128 --subset dtype=bf16

v=$st/venv/bin/python
if [ ! -x "$v" ]; then
  "$py" -m venv "$st/venv"
  "$py" -c "import site; print('\n'.join(site.getsitepackages()))" \
    > "$("$v" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-base.pth"
  echo "$st/site" >> "$("$v" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-base.pth"
  ver=$(basename "$st"/index/files/flash_attn-*.whl | cut -d- -f2)
  "$v" -m pip install -q --disable-pip-version-check --index-url "file://$st/index/simple" \
    "flash-attn==$ver" > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 5; }
  "$v" -m pip check >> "$out/pip.log" 2>&1
  "$v" -m pip list 2>/dev/null | grep -iE "^(flash|torch |transformers|einops)" >> "$out/pip.log"
  cat "$out/pip.log"
  "$v" -m wheelforge inspect "$st"/index/files/flash_attn-*.whl | head -12
fi
mkdir -p "$st/tests"
tar -xzf "$W"/sdists/flash_attn-*.tar.gz -C "$st/tests" --strip-components=2 --wildcards '*/tests/test_flash_attn.py'
cp "$repo"/gputests/flash-attn/*.py "$st/tests/"
cd "$st/tests" || exit 6
export PYTHONNOUSERSITE=1
[ "${UPSTREAM:-1}" = 1 ] && detached upstream "$v" -m pytest -q -p no:cacheprovider -p upstream_slice -x -rfE \
  --junitxml "$st/upstream.xml" test_flash_attn.py
detached ours "$v" -m pytest -q -p no:cacheprovider -rfE test_flash_attn_func.py
rc=0
if [ "${UPSTREAM:-1}" = 1 ]; then
  wait_for upstream || exit 3
  tail -5 "$st/upstream.log"; [ "$(cat "$st/upstream.rc")" = 0 ] || rc=1
fi
wait_for ours || exit 3
tail -3 "$st/ours.log"; [ "$(cat "$st/ours.rc")" = 0 ] || rc=1
detached model "$v" attention_model.py "$st/model"
wait_for model || exit 3
cp "$st/model/attention_model.json" "$out/" 2>/dev/null
grep -vE "^\s*$" "$st/model.log" | tail -30; [ "$(cat "$st/model.rc")" = 0 ] || rc=1
if [ "${SMALL:-0}" = 1 ]; then
  wait_for small || exit 3
  grep -E "^(published|already published)|ok compile" "$st/small.log"
  [ "$(cat "$st/small.rc")" = 0 ] || { tail -20 "$st/small.log"; rc=1; }
fi
exit $rc
