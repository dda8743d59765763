#!/usr/bin/env bash
# gpu-check-source.sh: what a checkout is, for the GPU check's summary (the GPU machine receives
# no .git): the commit, `git describe --always --dirty`, the branch, whether the tracked files
# differ from the commit, and a hash of `git status --porcelain` (untracked files included), one
# "key value" line each. bench/gpu-rehearse.sh writes it into the checkout's .gpu-check-source
# (ignored by git), which the device call carries; bench/gpu-check.sh reads that file there, and
# runs this itself where the checkout has its .git.
#
#   bench/gpu-check-source.sh [CHECKOUT]      (default: the checkout holding this script)
set -euo pipefail
src=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$src"
if ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "gpu-check-source: $src is not a git checkout" >&2
  exit 1
fi
status=$(git status --porcelain)
echo "commit $(git rev-parse HEAD)"
echo "describe $(git describe --always --dirty)"
echo "branch $(git rev-parse --abbrev-ref HEAD)"
echo "dirty $([ -n "$(git status --porcelain --untracked-files=no)" ] && echo yes || echo no)"
echo "status-sha256 $(printf '%s' "$status" | sha256sum | cut -d' ' -f1)"
echo "status-lines $(printf '%s' "$status" | grep -c . || true)"
echo "written $(date -u +%FT%TZ)"
