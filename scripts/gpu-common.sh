# Sourced by the scripts/*-on-gpu.sh scripts (the GPU machine has no network).
#
# gpu_site PY WHEELS ST: the packages wheelforge needs that the machine's python lacks
# (WHEELS/*.whl, carried with the payload) installed once into ST/site, without their
# dependencies; the caller puts ST/site on PYTHONPATH.  Returns 2 (its log printed) when
# pip fails.
gpu_site() {
  local py=$1 wheels=$2 st=$3
  [ -e "$st/site.done" ] && return 0
  "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$st/site" "$wheels"/*.whl > "$st/site.log" 2>&1 || { cat "$st/site.log"; return 2; }
  touch "$st/site.done"
}
