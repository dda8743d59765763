#!/usr/bin/env bash
# check-nccl-root.sh: -Dnccl_root configures wherever the NCCL lies: inside the source tree (a
# checkout's .nccl/, by absolute and by relative path), outside it (both again) and in a Python
# wheel's layout inside a virtual environment of the tree (nvidia/nccl: lib/libnccl.so.2 alone).
# Each form is configured in a fresh copy of the tree (tracked and untracked files that git does
# not ignore, as bench/gpu-rehearse.sh copies it), must find that NCCL (the summary's NCCL line)
# and compile a C file of the CUDA plugin that includes nccl.h.
#
#   scripts/check-nccl-root.sh NCCL_DIR     (NCCL_DIR: include/nccl.h, lib/libnccl.so.2)
#
# Needs nvcc, meson, ninja and git. Exit status 0 when every form passes, 1 otherwise (each
# failure is named, with the end of its log).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
nccl=$(cd "${1:?usage: scripts/check-nccl-root.sh NCCL_DIR}" && pwd)
[ -f "$nccl/include/nccl.h" ] && [ -f "$nccl/lib/libnccl.so.2" ] ||
  { echo "check-nccl-root: $nccl lacks include/nccl.h or lib/libnccl.so.2"; exit 1; }
tmp=$(mktemp -d /tmp/pmap-nccl-root.XXXXXX)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
tree=$tmp/tree
mkdir -p "$tree"
(cd "$src" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | tar -C "$tree" -xf -

# Two NCCLs inside the tree, of links to the files of NCCL_DIR in folders of their own (the
# paths are what matters to Meson): the runbook's .nccl/ and a wheel's nvidia/nccl.
mkdir -p "$tree/.nccl/include" "$tree/.nccl/lib"
ln -s "$nccl/include/nccl.h" "$tree/.nccl/include/nccl.h"
ln -s "$nccl/lib/libnccl.so.2" "$tree/.nccl/lib/libnccl.so.2"
wheel=$tree/.venv/lib/python3/site-packages/nvidia/nccl
mkdir -p "$wheel/include" "$wheel/lib"
ln -s "$nccl/include/nccl.h" "$wheel/include/nccl.h"
ln -s "$nccl/lib/libnccl.so.2" "$wheel/lib/libnccl.so.2"
outside_rel=$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' \
  "$nccl" "$tree")

failures=0
# form NAME NCCL_ROOT EXPECTED_LIBRARY
form() {
  local name=$1 root=$2 want=$3 b=$tmp/build-$1 obj
  if ! (cd "$tree" && meson setup "$b" -Dcuda=enabled -Dmpi=disabled -Dnccl_root="$root") \
    >"$tmp/$name.log" 2>&1; then
    echo "FAIL $name (-Dnccl_root=$root): configure"
    grep -A 2 'ERROR' "$tmp/$name.log" | tail -n 5
    failures=$((failures + 1))
    return
  fi
  if ! grep -E '^\s*NCCL\s*:' "$tmp/$name.log" | grep -qF "$want"; then
    echo "FAIL $name (-Dnccl_root=$root): the summary names another NCCL, want $want:"
    grep -F 'NCCL ' "$tmp/$name.log" | tail -n 2
    failures=$((failures + 1))
    return
  fi
  obj=$(ninja -C "$b" -t targets all | grep -o '^[^:]*cuda_nccl\.c\.o' | head -n 1)
  if [ -z "$obj" ] || ! ninja -C "$b" "$obj" >>"$tmp/$name.log" 2>&1; then
    echo "FAIL $name (-Dnccl_root=$root): runtime/cuda/cuda_nccl.c (includes nccl.h) does not compile"
    tail -n 15 "$tmp/$name.log"
    failures=$((failures + 1))
    return
  fi
  echo "OK $name: -Dnccl_root=$root finds $want"
}
form in-tree-absolute "$tree/.nccl" "$tree/.nccl/lib/libnccl.so.2"
form in-tree-relative .nccl "$tree/.nccl/lib/libnccl.so.2"
form outside-absolute "$nccl" "$nccl/lib/libnccl.so.2"
form outside-relative "$outside_rel" "$tree/$outside_rel/lib/libnccl.so.2"
form wheel-in-tree "$wheel" "$wheel/lib/libnccl.so.2"
if ((failures)); then
  echo "check-nccl-root: $failures of 5 forms failed"
  exit 1
fi
echo "check-nccl-root: all 5 forms of -Dnccl_root configure and compile against their NCCL"
