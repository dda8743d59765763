#!/usr/bin/env bash
# check-install.sh: installs pmap into a temporary prefix and builds examples/quickstart.c against
# it with `pkg-config --cflags --libs pmap` only, runs it, and checks that the shared library
# exports only pmap_ names. Usage: scripts/check-install.sh [BUILD_DIR] (a new build folder).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-install}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
rm -rf "$build"
meson setup "$build" --prefix "$prefix" -Dtests=false -Dcuda=disabled -Dmpi=disabled >"$build.log" 2>&1 ||
  { tail -n 40 "$build.log"; exit 1; }
ninja -C "$build" install >>"$build.log" 2>&1 || { tail -n 40 "$build.log"; exit 1; }
pc=$(dirname "$(find "$prefix" -name pmap.pc | head -n 1)")
[ -n "$pc" ] || { echo "check-install: no pmap.pc under $prefix"; exit 1; }
export PKG_CONFIG_PATH=$pc
flags=$(pkg-config --cflags --libs pmap)
echo "check-install: pkg-config --cflags --libs pmap: $flags"
cc -std=c11 -Wall -Wextra -Werror examples/quickstart.c $flags -o "$prefix/quickstart"
libdir=$(pkg-config --variable=libdir pmap)
LD_LIBRARY_PATH=$libdir "$prefix/quickstart"
lib=$(find "$libdir" -name 'libpmap.so.*' -type f | head -n 1)
extra=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^pmap_' || true)
if [ -n "$extra" ]; then
  echo "check-install: $lib exports names other than pmap_*:"
  echo "$extra"
  exit 1
fi
echo "check-install: $(nm -D --defined-only "$lib" | wc -l) exported symbols, all pmap_*; soname $(readelf -d "$lib" | grep -o 'soname: \[.*\]')"
# The plugins (those this build has) beside it export their entry points alone.
for plugin in "$(dirname "$lib")"/libpmap-*.so; do
  [ -e "$plugin" ] || continue
  extra=$(nm -D --defined-only "$plugin" | awk '{print $3}' | grep -v '^pmap_.*_entry$' || true)
  if [ -n "$extra" ]; then
    echo "check-install: $plugin exports more than its entry points:"
    echo "$extra"
    exit 1
  fi
  echo "check-install: $(basename "$plugin") exports only its entry points"
done
for tool in pmap-train pmap-bench pmap-allreduce; do
  [ -x "$prefix/bin/$tool" ] || { echo "check-install: $tool not installed"; exit 1; }
done
for h in pmap.h pmap_examples.h; do
  [ -f "$prefix/include/$h" ] || { echo "check-install: $h not installed"; exit 1; }
done
echo "check-install: OK"
