#!/usr/bin/env bash
# test.sh: installs what is missing, builds, and runs the whole test suite (meson test; GPU
# tests skip with exit 77 where there is no GPU). Arguments go to meson test, e.g. --suite unit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup.sh"
"$here/build.sh"
exec meson test -C "$here/../${BUILD_DIR:-build}" --print-errorlogs "$@"
