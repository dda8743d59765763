#!/usr/bin/env bash
# test_plugin.sh: libpmap.so without its plugins. It needs none of CUDA, cuBLAS, NCCL or MPI to
# load (its NEEDED entries), and with the plugins hidden, broken, foreign or empty a CPU program
# runs with none of them in the process, AUTO falls back to the CPU, and a CUDA context or one
# across processes is refused naming the plugin file and the loader's reason.
# Usage: test_plugin.sh BUILD_ROOT PROBE CUDA_BUILT MPI_BUILT FOREIGN_PLUGIN EMPTY_PLUGIN
#        INSTALL_LIBDIR
set -u
root=${1:?usage: test_plugin.sh BUILD_ROOT PROBE CUDA_BUILT MPI_BUILT FOREIGN EMPTY LIBDIR}
probe=$2 cuda=$3 mpi=$4 foreign=$5 empty=$6 libdir=$7
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
heavy=(libcudart libcublas libnccl libcuda.so libmpi libopen-pal)

# 1. What the loader needs for libpmap.so itself.
needed=$(readelf -d "$root/libpmap.so" | grep NEEDED)
if printf '%s\n' "$needed" | grep -E "cuda|cublas|nccl|mpi|open-pal|open-rte"; then
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

if [ "$mpi" = 1 ]; then
  run "mpi with libpmap.so alone" "${alone[@]}" PMAP_PLUGIN_DIR="$tmp/none" -- mpi \
    "pmap_ctx_create: dist mpi needs the plugin libpmap-mpi.so" "$tmp/none/libpmap-mpi.so" \
    "No such file or directory"
  run "an MPI launch with libpmap.so alone" "${alone[@]}" PMAP_PLUGIN_DIR="$tmp/none" \
    OMPI_COMM_WORLD_SIZE=2 -- launched "across the 2 processes an MPI launcher started" \
    "OMPI_COMM_WORLD_SIZE" "PMAP_DIST=none" "needs the plugin libpmap-mpi.so"
else
  run "mpi in a build without it" "${alone[@]}" -- mpi "this build has no MPI"
fi

# 4. Broken plugins: not a shared object, from another build, without an entry point.
echo "not a shared object" >"$tmp/broken/libpmap-cuda.so"
echo "not a shared object" >"$tmp/broken/libpmap-mpi.so"
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
  # The plugins of the build export their entry points and nothing else.
  exports=$(nm -D --defined-only "$root/libpmap-cuda.so" | awk '{print $3}' | sort | tr '\n' ' ')
  if [ "$exports" != "pmap_cuda_backend_entry pmap_cuda_ops_entry " ]; then
    bad "libpmap-cuda.so exports: $exports"
  else
    echo "ok: libpmap-cuda.so exports $exports"
  fi
fi
if [ "$mpi" = 1 ]; then
  run "mpi, broken plugin" PMAP_PLUGIN_DIR="$tmp/broken" -- mpi \
    "pmap_ctx_create: dist mpi needs the plugin libpmap-mpi.so" "$tmp/broken/libpmap-mpi.so" \
    "does not load" "file too short"
  exports=$(nm -D --defined-only "$root/libpmap-mpi.so" | awk '{print $3}' | sort | tr '\n' ' ')
  if [ "$exports" != "pmap_mpi_dist_entry " ]; then
    bad "libpmap-mpi.so exports: $exports"
  else
    echo "ok: libpmap-mpi.so exports $exports"
  fi
fi

if [ "$fails" -ne 0 ]; then
  echo "test_plugin: $fails failed" >&2
  exit 1
fi
echo "test_plugin: ok"
