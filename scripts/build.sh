#!/usr/bin/env bash
# build.sh: configures (once) and builds pmap in $BUILD_DIR (default build), with any extra
# Meson options in $MESON_ARGS (e.g. "-Dgemm=portable" or "-Dcuda=enabled").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  # shellcheck disable=SC2086
  meson setup "$build" ${MESON_ARGS:-}
fi
ninja -C "$build"
