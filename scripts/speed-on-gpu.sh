#!/usr/bin/env bash
# Issue 7's proof on a GPU machine without network, in one go:
#   0. warm the page cache (torch's import, torch's and CUDA's headers, nvcc's
#      programs), so that the first build does not also pay for a fresh machine's disk;
#   1. bench/build_speed.py: split, unsplit and upstream's default build of
#      causal-conv1d, side by side (in the order C, B, A), with this machine's
#      python/torch;
#   2. as the unsplit build (B) starts (it is soon one translation unit, so most
#      cores are idle; B's time is slightly inflated, A's and C's are not): upstream's
#      tests/test_causal_conv1d.py against the installed split wheel (C);
#   3. after the benchmark: scripts/compare-wheels.py on the unsplit and split wheels
#      (exported symbols, archs, every kernel's SASS).
#
#   scripts/speed-on-gpu.sh SOURCES_DIR OUT_DIR [ARCH] [PYTHON]
#       ARCH default: this GPU's; PYTHON default: python3 on PATH (must have torch)
# Logs: OUT_DIR/speed.log, OUT_DIR/test.log, OUT_DIR/compare.log
# BUILDS=CB leaves out upstream's build.
set -uo pipefail
src=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
py=${4:-$(command -v python3)}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
arch=${3:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
wheels=$out/wheels
cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
torch_inc=$("$py" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
find "$cuda"/bin "$cuda"/nvvm "$cuda"/include "$torch_inc" -type f -print0 2>/dev/null \
  | xargs -0 cat > /dev/null
"$py" bench/build_speed.py --python "$py" --sources "$src" --arch "$arch" --keep "$wheels" \
  --builds "${BUILDS:-CBA}" > "$out/speed.log" 2>&1 &
bench=$!

# build order: C, B, A
until ls "$wheels"/C/*.whl >/dev/null 2>&1 || ! kill -0 $bench 2>/dev/null; do sleep 5; done
rc=0
if ls "$wheels"/C/*.whl >/dev/null 2>&1; then
  t=$(mktemp -d)
  tar xzf "$src"/causal_conv1d-*.tar.gz -C "$t" --no-same-owner
  mkdir "$t/run" && cp "$t"/causal_conv1d-*/tests/test_causal_conv1d.py "$t/run/"
  (
    "$py" -m pip install -q --no-deps --no-index --target "$t/site" "$wheels"/C/*.whl &&
    cd "$t/run" && PYTHONPATH=$t/site "$py" -m pytest -q -p no:cacheprovider \
      -n "${WORKERS:-8}" test_causal_conv1d.py
  ) > "$out/test.log" 2>&1 || rc=1
  echo "upstream tests on the split wheel: rc=$rc" >> "$out/test.log"
fi
wait $bench || rc=1
"$py" scripts/compare-wheels.py "$wheels"/B/*.whl "$wheels"/C/*.whl > "$out/compare.log" 2>&1 \
  || rc=1
exit $rc
