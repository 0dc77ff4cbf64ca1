#!/bin/sh
# Run "$@" on a machine without a visible CUDA toolkit: inside a mount namespace of its
# own (run it under `unshare -m`, as root), an empty directory is bind-mounted over
# /usr/local/cuda's target; CUDA_HOME and CUDA_PATH are unset and PATH loses every
# directory whose name holds "cuda".  $1: the empty directory; the rest: the command.
set -eu
empty=$1
shift
target=$(readlink -f /usr/local/cuda 2>/dev/null || true)
if [ -n "$target" ] && [ -e "$target" ]; then
    mount --bind "$empty" "$target"
fi
if [ -e /usr/local/cuda/bin/nvcc ]; then
    echo "hide_cuda.sh: /usr/local/cuda/bin/nvcc is still visible" >&2
    exit 97
fi
unset CUDA_HOME CUDA_PATH
PATH=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd: -)
export PATH
exec "$@"
