#!/usr/bin/env bash
# test_plugin.sh: libpmap.so without its plugins. It needs none of CUDA, cuBLAS, NCCL or MPI to
# load (its NEEDED entries), and with the plugins hidden, broken, foreign or empty a CPU program
# runs with none of them in the process, AUTO falls back to the CPU, and a CUDA context is refused
# naming the plugin file and the loader's reason.
# Usage: test_plugin.sh BUILD_ROOT PROBE CUDA_BUILT FOREIGN_PLUGIN EMPTY_PLUGIN INSTALL_LIBDIR
set -u
root=${1:?usage: test_plugin.sh BUILD_ROOT PROBE CUDA_BUILT FOREIGN_PLUGIN EMPTY_PLUGIN INSTALL_LIBDIR}
probe=$2 cuda=$3 foreign=$4 empty=$5 libdir=$6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# run NAME ENV... -- ARGS...: the probe with the environment given, PMAP_PLUGIN_DIR unset unless
# given; a failure prints its output.
run() {
  local name=$1 envs=()
  shift
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if ! env -u PMAP_PLUGIN_DIR "${envs[@]}" "$probe" "$@" >"$tmp/out" 2>&1; then
    bad "$name: $(cat "$tmp/out")"
  else
    echo "ok: $name: $(tail -n 2 "$tmp/out" | tr '\n' ' ')"
  fi
}
heavy=(libcudart libcublas libnccl libcuda.so)

# 1. What the loader needs for libpmap.so itself.
needed=$(readelf -d "$root/libpmap.so" | grep NEEDED)
if printf '%s\n' "$needed" | grep -E "cuda|cublas|nccl"; then
  bad "libpmap.so needs CUDA, NCCL or MPI to load: $needed"
else
  echo "ok: libpmap.so NEEDED: $(printf '%s' "$needed" | grep -o '\[.*\]' | tr '\n' ' ')"
fi

# 2. A CPU program with the plugins of the build folder present loads none of them.
run "cpu beside the plugins" -- cpu "${heavy[@]}"

# 3. libpmap.so copied alone into a folder of its own (LD_LIBRARY_PATH comes before the probe's
#    run path), PMAP_PLUGIN_DIR unset: found nowhere unless the install folder holds plugins.
mkdir -p "$tmp/alone" "$tmp/none" "$tmp/broken" "$tmp/foreign" "$tmp/empty"
cp -L "$root/libpmap.so" "$tmp/alone/libpmap.so.0"
alone=(LD_LIBRARY_PATH="$tmp/alone")
run "cpu with libpmap.so alone" "${alone[@]}" -- cpu "${heavy[@]}"
run "auto with libpmap.so alone" "${alone[@]}" -- auto
if [ "$cuda" = 1 ]; then
  # The install folder may hold plugins of an installed pmap: then PMAP_PLUGIN_DIR hides them.
  run "cuda with libpmap.so alone" "${alone[@]}" PMAP_PLUGIN_DIR="$tmp/none" -- cuda \
    "pmap_ctx_create: backend cuda needs the plugin libpmap-cuda.so" "$tmp/none/libpmap-cuda.so" \
    "No such file or directory" "PMAP_PLUGIN_DIR"
  # Without PMAP_PLUGIN_DIR: the folder of the libpmap.so that is loaded, then the install's.
  if [ -e "$libdir/libpmap-cuda.so" ]; then
    echo "note: $libdir holds a plugin of an installed pmap: libpmap.so alone would load it"
  else
    run "cuda with libpmap.so alone, PMAP_PLUGIN_DIR unset" "${alone[@]}" -- cuda \
      "$tmp/alone (beside libpmap)" "$tmp/alone/libpmap-cuda.so: cannot open shared object file" \
      "$libdir (the install's library folder)"
  fi
else
  run "cuda in a build without it" "${alone[@]}" -- cuda "this build has no cuda backend"
fi

# 4. Broken plugins: not a shared object, from another build, without an entry point.
echo "not a shared object" >"$tmp/broken/libpmap-cuda.so"
cp "$foreign" "$tmp/foreign/libpmap-cuda.so"
cp "$empty" "$tmp/empty/libpmap-cuda.so"
for kind in broken foreign empty; do
  dir=(PMAP_PLUGIN_DIR="$tmp/$kind")
  run "cpu, $kind plugin" "${dir[@]}" -- cpu "${heavy[@]}"
  run "auto, $kind plugin" "${dir[@]}" -- auto
done
if [ "$cuda" = 1 ]; then
  run "cuda, broken plugin" PMAP_PLUGIN_DIR="$tmp/broken" -- cuda \
    "needs the plugin libpmap-cuda.so" "$tmp/broken/libpmap-cuda.so" "does not load" \
    "file too short"
  run "cuda, foreign plugin" PMAP_PLUGIN_DIR="$tmp/foreign" -- cuda \
    "needs the plugin libpmap-cuda.so" "built for another libpmap" "0123456789abcdef"
  run "cuda, plugin without entry point" PMAP_PLUGIN_DIR="$tmp/empty" -- cuda \
    "needs the plugin libpmap-cuda.so" "has no pmap_cuda_backend_entry" "undefined symbol"
  # The plugin of the build exports its two entry points and nothing else.
  exports=$(nm -D --defined-only "$root/libpmap-cuda.so" | awk '{print $3}' | sort | tr '\n' ' ')
  if [ "$exports" != "pmap_cuda_backend_entry pmap_cuda_ops_entry " ]; then
    bad "libpmap-cuda.so exports: $exports"
  else
    echo "ok: libpmap-cuda.so exports $exports"
  fi
fi

if [ "$fails" -ne 0 ]; then
  echo "test_plugin: $fails failed" >&2
  exit 1
fi
echo "test_plugin: ok"
