#!/usr/bin/env bash
# mamba-ssm's build speed on a GPU machine without network (issue 18, item 6), in one go:
#   0. warm the page cache (torch's and CUDA's headers, nvcc's programs), so that the
#      first build does not also pay for a fresh machine's disk;
#   1. bench/build_speed.py --recipe mamba-ssm: split (C), unsplit (B) and upstream's
#      default build (A), side by side in that order, with this machine's python/torch;
#   2. after the benchmark: scripts/compare-wheels.py on the unsplit and split wheels
#      (or, where built, D and E: the split packed by the model and by the record; or D
#      and P: lent after a unit's end as now and as before)
#      (exported symbols, archs, every kernel's SASS), and upstream's
#      tests/ops/test_selective_scan.py (test_selective_scan; test_mamba_inner_fn needs
#      causal-conv1d) from the pinned commit against the split wheel.
#
#   scripts/mamba-speed-on-gpu.sh BUNDLE OUT_DIR [ARCH] [PYTHON]
#       BUNDLE: the offline mirror of https://github.com/state-spaces/mamba
#       ARCH default: this GPU's; PYTHON default: python3 on PATH (must have torch)
# The work runs detached (setsid) from a copy of this checkout; the script waits up to
# $BUDGET seconds (default 540) and exits 3 while it runs: run it again to collect.
# Logs: OUT_DIR/speed.log, OUT_DIR/compare.log, OUT_DIR/test.log, the ninja logs
# (ninja-<letter>.txt, the last build of a letter; ninja-<place><letter>.txt, each build);
# with PHASES=1 also OUT_DIR/kept.tgz: <letter>/, each build's nvcc phase times, the pool's
# free slots and unit-cost record (bench/build_speed.py --phases; scripts/unit-timeline.py).
set -uo pipefail
bundle=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); out=$(mkdir -p "$2" && cd "$2" && pwd)
py=${4:-$(command -v python3)}
st=/tmp/wf-mamba-speed
deadline=$(( $(date +%s) + ${BUDGET:-540} ))
commit=e9594ce1c732d97440f0332fdc43170a2294dbfa
if [ ! -e "$st/started" ]; then
  mkdir -p "$st" && touch "$st/started"
  repo=$st/repo; mkdir -p "$repo"
  cp -r "$(dirname "$0")/.."/{src,recipes,patches,bench,scripts} "$repo"/
  arch=${3:-$("$py" -c 'import torch; p = torch.cuda.get_device_properties(0); print(f"{p.major}.{p.minor}")')}
  cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
  torch_inc=$("$py" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
  setsid nohup bash -c "
    export PYTHONUNBUFFERED=1
    find '$cuda'/bin '$cuda'/nvvm '$cuda'/include '$torch_inc' -type f -print0 2>/dev/null \
      | xargs -0 cat > /dev/null
    '$py' '$repo/bench/build_speed.py' --recipe mamba-ssm --python '$py' --arch '$arch' \
      --git-mirror 'https://github.com/state-spaces/mamba=$bundle' --keep '$st/wheels' \
      --builds '${BUILDS:-CBA}' ${PHASES:+--phases} > '$st/speed.log' 2>&1
    echo \$? > '$st/speed.rc'
    if ls '$st'/wheels/D/*.whl '$st'/wheels/E/*.whl > /dev/null 2>&1; then
      '$py' '$repo/scripts/compare-wheels.py' '$st'/wheels/D/*.whl '$st'/wheels/E/*.whl \
        > '$st/compare.log' 2>&1
    elif ls '$st'/wheels/D/*.whl '$st'/wheels/P/*.whl > /dev/null 2>&1; then
      '$py' '$repo/scripts/compare-wheels.py' '$st'/wheels/D/*.whl '$st'/wheels/P/*.whl \
        > '$st/compare.log' 2>&1
    elif ls '$st'/wheels/C/*.whl '$st'/wheels/D/*.whl > /dev/null 2>&1; then
      '$py' '$repo/scripts/compare-wheels.py' '$st'/wheels/C/*.whl '$st'/wheels/D/*.whl \
        > '$st/compare.log' 2>&1
    elif ls '$st'/wheels/B/*.whl '$st'/wheels/C/*.whl > /dev/null 2>&1; then
      '$py' '$repo/scripts/compare-wheels.py' '$st'/wheels/B/*.whl '$st'/wheels/C/*.whl \
        > '$st/compare.log' 2>&1
    else
      echo 'no comparison: neither D and E, C and D nor B and C were built (BUILDS)' > '$st/compare.log'
    fi
    tested=C; ls '$st'/wheels/D/*.whl > /dev/null 2>&1 && tested=D
    ls '$st'/wheels/E/*.whl > /dev/null 2>&1 && tested=E
    git init -q '$st/up' && git -C '$st/up' fetch -q '$bundle' '+refs/heads/*:refs/heads/*' \
      && mkdir -p '$st/run' && git -C '$st/up' show '$commit:tests/ops/test_selective_scan.py' \
      > '$st/run/test_selective_scan.py'
    echo \"upstream's test_selective_scan against the \$tested wheel\" > '$st/test.log'
    '$py' -m pip install -q --no-index --no-deps --target '$st/site' '$st'/wheels/\$tested/*.whl \
      >> '$st/test.log' 2>&1
    (cd '$st/run' && PYTHONPATH='$st/site' '$py' -m pytest -q -p no:cacheprovider \
      test_selective_scan.py -k 'not test_mamba_inner_fn' >> '$st/test.log' 2>&1)
    echo \$? > '$st/test.rc'
    touch '$st/done'" > /dev/null 2>&1 &
fi
while [ ! -e "$st/done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
cp "$st"/*.log "$out"/ 2>/dev/null
for b in A B C D E P S; do
  cp "$st/wheels/$b/ninja_log.txt" "$out/ninja-$b.txt" 2>/dev/null
  for f in "$st/wheels/$b"/ninja_log-*.txt; do [ -e "$f" ] && cp "$f" "$out/ninja-${f##*ninja_log-}"; done
done
# PHASES=1: each build's nvcc phases, the pool's free slots and the unit-cost record, in
# one file (a device run brings back few files): tar xzf kept.tgz; scripts/unit-timeline.py
(cd "$st/wheels" && ls -d */phases-*.csv > /dev/null 2>&1 \
  && tar czf "$out/kept.tgz" */ninja_log-*.txt */phases-*.csv */free-*.json */record-*.json 2>/dev/null)
cat "$st/speed.log"
if [ ! -e "$st/done" ]; then echo "(still running)"; exit 3; fi
echo "== compare"; tail -20 "$st/compare.log"
echo "== test (exit $(cat "$st/test.rc"))"; tail -5 "$st/test.log"
