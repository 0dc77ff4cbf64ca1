#!/usr/bin/env bash
# A channel built on another machine, proven on a GPU machine without network as a user
# takes it: the torch 2.11 channel's causal-conv1d and mamba-ssm (built elsewhere with the
# managed CUDA toolkit from PyPI, for this GPU's arch) installed from that index with their
# dependencies onto this machine's python, and `wheelforge test` running upstream's tests
# (tests/test_causal_conv1d.py from the sdist; tests/ops/test_selective_scan.py from the
# pinned commit) and wheelforge's own GPU tests against them.
#
#   scripts/channel-on-gpu.sh PAYLOAD OUT_DIR
#
# PAYLOAD holds index/ (the index as `wheelforge build` published it), sdists/ (the
# causal-conv1d sdist), state-spaces-mamba.bundle, and wheels/ (wheelforge's runtime
# packages the machine lacks, put on PYTHONPATH).  NAMES: the recipes to test (default
# "causal-conv1d mamba-ssm"; "causal-conv1d-stable" for the stable-ABI wheel, issue 55).
# Each test runs detached (setsid); the script waits up to $BUDGET seconds (default 540):
# run it again to pick up where it is.
set -uo pipefail
W=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3)
st=/tmp/wf-channel; mkdir -p "$st"
export PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
. "$repo/scripts/gpu-common.sh"
gpu_site "$py" "$W/wheels" "$st" || exit 2
[ -e "$out/machine.txt" ] || { nproc; nvidia-smi -L; cat /proc/loadavg
  "$py" -c 'import torch; print(torch.__version__)'; ls -la "$W"/index/files; } \
  > "$out/machine.txt" 2>&1
export PYTHONPATH=$repo/src:$st/site
mirror=https://github.com/state-spaces/mamba=$W/state-spaces-mamba.bundle
detached() {  # NAME COMMAND...: run once, in the background, recording NAME.rc
  local name=$1; shift
  [ -e "$st/$name.started" ] && return 0
  touch "$st/$name.started"; date +%s > "$st/$name.t0"
  setsid nohup bash -c '"$@" > "'"$st/$name.log"'" 2>&1; echo $? > "'"$st/$name.rc"'"
    date +%s > "'"$st/$name.t1"'"' _ "$@" > /dev/null 2>&1 &
}
rc=0
for name in ${NAMES:-causal-conv1d mamba-ssm}; do  # one after the other: they share the GPU
  detached "$name" "$py" -m wheelforge test "$name" --python "$py" --index "$W/index" \
    --sources "$W/sdists" --cache-dir "$st/cache" --recipes "$repo/recipes" \
    --git-mirror "$mirror"
  while [ ! -e "$st/$name.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 3; done
  cp "$st/$name.log" "$out/" 2>/dev/null
  if [ ! -e "$st/$name.rc" ]; then
    echo "$name still running after $(( $(date +%s) - $(cat "$st/$name.t0") )) s"
    tail -3 "$st/$name.log"; exit 3
  fi
  echo "$name exit $(cat "$st/$name.rc"), $(( $(cat "$st/$name.t1") - $(cat "$st/$name.t0") )) s"
  grep -E "passed|failed|error|installed|Successfully" "$st/$name.log" | tail -8
  [ "$(cat "$st/$name.rc")" = 0 ] || rc=1
done
exit $rc
