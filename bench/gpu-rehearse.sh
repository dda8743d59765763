#!/usr/bin/env bash
# gpu-rehearse.sh: the GPU check's one device call rehearsed on this machine as it will happen
# there. It reads the call from docs/cuda.md's runbook (its command, carry and timeout_s rows),
# builds what the GPU machine receives in a new folder (the working tree's tracked files and the
# untracked ones git does not ignore, no .git, plus every carried path), sets OUT to an empty
# folder as the device tool does, and runs the runbook's command there verbatim with --dry-run.
#
#   bench/gpu-rehearse.sh [--nccl DIR] [--keep]
#
# --nccl DIR  the carried .nccl/ is a copy of DIR (as the runbook's `cp -r` makes it), not the
#             checkout's own .nccl/ (which CI's fresh clone lacks)
# --keep      leave the rehearsal's folder (its path is printed)
#
# It fails when the command fails or leaves a step that is not pass, planned or not-run for want
# of a GPU, or a step whose limit comes without its reasoning; when what comes back breaks the device tool's limits (at most 8 plain files, no more
# than 2 folders deep) or lacks the summary; when what travels exceeds 64 MiB; or when the
# check's budget does not end it inside the call's timeout_s. Exit status 0 when it passes.
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NCCL_FROM="" KEEP=0
while [ $# -gt 0 ]; do
  case $1 in
  --nccl) NCCL_FROM=$(cd "${2:?gpu-rehearse: --nccl needs a folder}" && pwd) || exit 1; shift 2 ;;
  --keep) KEEP=1; shift ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu-rehearse: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
failures=0
fail() {
  echo "gpu-rehearse: FAIL: $*"
  failures=$((failures + 1))
}

# The call, as the runbook gives it: | command | `...` |, | carry | `[...]` |, | timeout_s | `N` |
row() { sed -n "s/^| $1 | \`\(.*\)\` |\$/\1/p" "$SRC/docs/cuda.md" | head -n 1; }
COMMAND=$(row command) CARRY=$(row carry) TIMEOUT_S=$(row timeout_s)
if [ -z "$COMMAND" ] || [ -z "$CARRY" ] || [ -z "$TIMEOUT_S" ]; then
  echo "gpu-rehearse: docs/cuda.md's runbook lacks its command, carry or timeout_s row"
  exit 1
fi
mapfile -t CARRIED < <(python3 -c 'import json, sys
for p in json.loads(sys.argv[1]): print(p)' "$CARRY") ||
  { echo "gpu-rehearse: the runbook's carry $CARRY is not a JSON list"; exit 1; }
echo "gpu-rehearse: the runbook's call: command $COMMAND; carry $CARRY; timeout_s $TIMEOUT_S"

tmp=$(mktemp -d /tmp/pmap-gpu-rehearse.XXXXXX)
cleanup() {
  if ((KEEP)); then
    echo "gpu-rehearse: kept $tmp"
  else
    chmod -R u+w "$tmp" 2>/dev/null
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
tree=$tmp/received out=$tmp/out
mkdir -p "$tree" "$out"
# The working tree as git sees it: what exists of the tracked files, and the untracked ones
# not ignored; no .git.
(cd "$SRC" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | tar -C "$tree" -xf - || { echo "gpu-rehearse: cannot copy the tree"; exit 1; }
for p in "${CARRIED[@]}"; do
  from=$SRC/$p
  [ "$p" = .nccl ] && [ -n "$NCCL_FROM" ] && from=$NCCL_FROM
  if [ ! -e "$from" ]; then
    fail "the runbook carries $p, which $SRC lacks (its first step makes it)"
    continue
  fi
  rm -rf "${tree:?}/$p"
  mkdir -p "$(dirname "$tree/$p")"
  cp -r "$from" "$tree/$p"
done
kib=$(du -sk "$tree" | cut -f1)
echo "gpu-rehearse: $((kib / 1024)) MiB travel: the tree and ${CARRIED[*]}"
((kib <= 64 * 1024)) || fail "$((kib / 1024)) MiB travel, more than the device tool's 64 MiB"
((failures)) && exit 1

# The command verbatim, in the received tree, with OUT set and none of this shell's settings
# of the check; --dry-run appended.
echo "gpu-rehearse: in $tree: OUT=$out; $COMMAND --dry-run"
(cd "$tree" && env -u GPU_CHECK_BUILD_DIR -u GPU_CHECK_NCCL -u GPU_CHECK_BUDGET_S OUT="$out" \
  bash -c "$COMMAND --dry-run")
rc=$?
[ "$rc" = 0 ] || fail "the command exited $rc"

# What comes back: plain files, at most 8, no more than 2 folders deep.
count=$(find "$out" -type f | wc -l)
((count <= 8)) || fail "$count files in OUT, more than the 8 that come back: $(cd "$out" && find . -type f)"
odd=$(find "$out" -mindepth 1 ! -type f ! -type d)
[ -z "$odd" ] || fail "OUT holds what is not a plain file (does not come back): $odd"
deep=$(find "$out" -mindepth 3 -type d)
[ -z "$deep" ] || fail "OUT has folders deeper than 2: $deep"
for f in summary.md summary.json; do [ -s "$out/$f" ] || fail "OUT lacks $f"; done
if [ -s "$out/summary.json" ]; then
  python3 - "$out/summary.json" "$TIMEOUT_S" <<'PY' || fail "the summary's verdict (above)"
import json, sys
s = json.load(open(sys.argv[1]))
timeout = int(sys.argv[2])
bad = []
for st in s["steps"]:
    ok = st["status"] in ("pass", "planned") or (st["status"] == "not-run" and st["note"] == "no GPU")
    if not ok:
        bad.append("%s: %s (%s)" % (st["name"], st["status"], st["note"]))
    # Every step of the plan says where its limit comes from.
    if st.get("limit_s") is not None and not st.get("limit_why", "").startswith("%d s = " % st["limit_s"]):
        bad.append("%s: limit %s s without its reasoning (%r)" % (st["name"], st["limit_s"], st.get("limit_why")))
if s.get("result") != "dry-run-pass":
    bad.append("result %r, want dry-run-pass" % s.get("result"))
# The check ends by itself within its budget; the call must leave room for the summary after.
if s["budget_s"] + 10 > timeout:
    bad.append("budget %d s leaves less than 10 s of the call's %d s" % (s["budget_s"], timeout))
for b in bad:
    print("  step or verdict not as it must be:", b)
print("gpu-rehearse: %d steps: %d planned, %d passed (checks), budget %d s, plan %d s, timeout_s %d"
      % (len(s["steps"]), s["planned"], s["passed"], s["budget_s"], s["plan_s"], timeout))
sys.exit(1 if bad else 0)
PY
fi
if ((failures)); then
  echo "gpu-rehearse: $failures failed"
  exit 1
fi
echo "gpu-rehearse: the runbook's call passes its rehearsal ($count files back: $(cd "$out" && ls | tr '\n' ' '))"
