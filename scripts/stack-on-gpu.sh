#!/usr/bin/env bash
# The stack on a GPU machine without network: build the four shipped recipes against the
# machine's own python/torch into an index there (no stack gate: its fresh venv would need
# torch from an index), then `wheelforge test --stack` over that python: every wheel of the
# channel installed together through the index, pip resolving the rest against what the
# python holds, upstream's and wheelforge's GPU tests in that venv, and the hybrid models'
# fast path by kernel name (gputests/stack/hybrid_models.py).
#
#   scripts/stack-on-gpu.sh PAYLOAD OUT_DIR
#
# PAYLOAD holds sdists/ (causal-conv1d, fla-core, flash-linear-attention),
# state-spaces-mamba.bundle and wheels/ (wheelforge's own runtime packages the machine
# lacks, put on PYTHONPATH).  Each step runs detached (setsid) and the script waits up to
# $BUDGET seconds (default 540); run it again to pick up what is still running.  ARCH
# (default: this GPU's), JOBS (default: cores).
set -uo pipefail
W=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3)
st=/tmp/wf-stack; mkdir -p "$st"
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
. "$repo/scripts/gpu-common.sh"
gpu_site "$py" "$W/wheels" "$st" || exit 2
export PYTHONPATH=$repo/src:$st/site
arch=${ARCH:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
jobs=${JOBS:-$(nproc)}
mirror="https://github.com/state-spaces/mamba=$W/state-spaces-mamba.bundle"

detached() {  # NAME COMMAND...: run once, in the background, recording NAME.rc and times
  local name=$1; shift
  [ -e "$st/$name.started" ] && return 0
  touch "$st/$name.started"; date +%s > "$st/$name.t0"
  setsid nohup bash -c '"$@" > "'"$st/$name.log"'" 2>&1; echo $? > "'"$st/$name.rc"'"; date +%s > "'"$st/$name.t1"'"' \
    _ "$@" > /dev/null 2>&1 &
}
wait_for() {  # NAME: 0 when done, 3 when still running at the deadline
  while [ ! -e "$st/$1.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 3; done
  cp "$st/$1.log" "$out/" 2>/dev/null
  if [ ! -e "$st/$1.rc" ]; then
    echo "$1 still running after $(( $(date +%s) - $(cat "$st/$1.t0") )) s:"; tail -3 "$st/$1.log"
    return 3
  fi
  echo "$1 exit $(cat "$st/$1.rc"), wall $(( $(cat "$st/$1.t1") - $(cat "$st/$1.t0") )) s"
}

detached build "$py" -m wheelforge build causal-conv1d fla-core flash-linear-attention \
  mamba-ssm --recipes "$repo/recipes" --python "$py" --arch "$arch" -j "$jobs" \
  --index "$st/index" --cache-dir "$st/cache" --work-dir "$st/work" --sources "$W/sdists" \
  --git-mirror "$mirror" --no-stack-check
wait_for build || exit 3
grep -E "^(published|already published|stack)" "$st/build.log"
[ "$(cat "$st/build.rc")" = 0 ] || { tail -40 "$st/build.log"; exit 4; }

detached stack "$py" -m wheelforge test --stack --python "$py" --index "$st/index" \
  --recipes "$repo/recipes" --sources "$W/sdists" --git-mirror "$mirror" \
  --cache-dir "$st/cache" --workers 8 --report "$st/stack.json"
wait_for stack || exit 3
cp "$st/stack.json" "$out/" 2>/dev/null
grep -vE "^\s*(\[|\.\.\.)" "$st/stack.log" | tail -30
exit "$(cat "$st/stack.rc")"
