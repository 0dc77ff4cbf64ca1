#!/usr/bin/env bash
# Issue 26 on a GPU machine without network: bench/multi_recipe.py with this machine's
# python/torch (--python), cold compiles: the four-recipe command with its builds at
# once against the same command one after another (WHEELFORGE_BUILDS_AT_ONCE=off).
# UNIT_COSTS=record: both variants order their compiles by the unit costs a first build
# (not timed) recorded (since issue 53 a record never repacks the units).  ONLY='at once'
# (or 'one after another'): that variant alone; ROUNDS=N: N rounds of it.
#
#   scripts/multi-recipe-on-gpu.sh PAYLOAD OUT_DIR
#
# PAYLOAD holds sdists/ (causal-conv1d, fla-core, flash-linear-attention),
# state-spaces-mamba.bundle and wheels/: wheelforge's runtime packages (put on
# PYTHONPATH) and the build requirements (setuptools, wheel, packaging, ninja>=1.13,
# installed into the python when missing).  ARCH (default: this GPU's).  The bench runs detached (setsid); the script
# waits up to $BUDGET seconds (default 540) and exits 3 while it runs: run it again.
set -uo pipefail
W=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
py=$(command -v python3)
st=/tmp/wf-multi; mkdir -p "$st"
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
if [ ! -e "$st/started" ]; then
  touch "$st/started"
  "$py" -m pip install -q --no-index --no-deps --target "$st/site" \
    $(ls "$W"/wheels/*.whl | grep -vE '/(ninja|setuptools|wheel)-') > "$st/setup.log" 2>&1
  "$py" -m pip install -q --no-index --find-links "$W/wheels" setuptools wheel packaging \
    'ninja>=1.13' >> "$st/setup.log" 2>&1
  { "$py" -m pip list 2>/dev/null | grep -iE '^(ninja|setuptools|wheel|packaging|torch) '; \
    nproc; uptime; } >> "$st/setup.log"
  arch=${ARCH:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
  cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  torch_inc=$("$py" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
  setsid nohup bash -c "
    export PYTHONUNBUFFERED=1 PYTHONPATH='$repo/src:$st/site'
    find '$cuda'/bin '$cuda'/nvvm '$cuda'/include '$torch_inc' -type f -print0 2>/dev/null \
      | xargs -0 cat > /dev/null
    set -- '$repo/bench/multi_recipe.py' --compile-cache off --unit-costs '${UNIT_COSTS:-none}' ${ONLY:+--only '$ONLY'} ${ROUNDS:+--rounds $ROUNDS}
    '$py' \"\$@\" --python '$py' --arch '$arch' --sources '$W/sdists' \
      --git-mirror 'https://github.com/state-spaces/mamba=$W/state-spaces-mamba.bundle' \
      ${RECIPES:+--recipes $RECIPES} > '$st/bench.log' 2>&1
    echo \$? > '$st/bench.rc'" > /dev/null 2>&1 &
fi
while [ ! -e "$st/bench.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
cat "$st/setup.log"
cp "$st"/*.log "$out"/ 2>/dev/null
for f in /tmp/wf-bench-multi-*/build.log; do
  [ -e "$f" ] && cp "$f" "$out/build-$(basename "$(dirname "$f")").log"
done
cat "$st/bench.log"
if [ ! -e "$st/bench.rc" ]; then echo "(still running)"; exit 3; fi
exit "$(cat "$st/bench.rc")"
