#!/usr/bin/env bash
# Build the shipped recipes on a GPU machine against its own python/torch, publish them
# to an index there, and prove them with `wheelforge test`.  Works without network:
# the sdists come from SOURCES_DIR.
#
#   scripts/prove-on-gpu.sh SOURCES_DIR OUT_DIR [ARCH]     (ARCH default: this GPU's)
set -uo pipefail
src=$(cd "$1" && pwd); out=$2; arch=${3:-}
cd "$(dirname "$0")/.."
py=$(command -v python3)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$out"
if [ -z "$arch" ]; then
  arch=$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')
fi
idx=$out/index; cache=$out/cache
rc=0
"$py" -m wheelforge doctor --arch "$arch" --python "$py" --cache-dir "$cache" || rc=1
timer=(); [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
start=$(date +%s)
"${timer[@]}" "$py" -m wheelforge build causal-conv1d fla-core flash-linear-attention \
  --python "$py" --arch "$arch" --sources "$src" --index "$idx" --cache-dir "$cache" \
  2> >(tee "$out/build.err" >&2) || rc=1
echo "build wall time: $(( $(date +%s) - start )) s"
for name in causal-conv1d fla-core flash-linear-attention; do
  "$py" -m wheelforge test "$name" --python "$py" --index "$idx" --sources "$src" \
    --cache-dir "$cache" || rc=1
done
"$py" -m wheelforge inspect "$idx"/files/causal_conv1d-*.whl || rc=1
exit $rc
