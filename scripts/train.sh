#!/usr/bin/env bash
# train.sh: the main job from a fresh Debian machine: installs what is missing, builds, and runs
# pmap-train (default: the linear seed model on 4 CPU virtual devices). Arguments go to
# pmap-train, e.g. scripts/train.sh --model convnet --devices 2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/setup.sh"
"$here/build.sh" >/dev/null
exec "$here/../${BUILD_DIR:-build}/tools/pmap-train" "$@"
