#!/usr/bin/env bash
# gpu-rehearse.sh: the GPU check's one device call rehearsed on this machine as it will happen
# there. It first writes the checkout's .gpu-check-source (bench/gpu-check-source.sh: the commit,
# whether it is dirty, a hash of `git status --porcelain`), which the call carries so that the
# summary can name its source where there is no .git. It reads the call from docs/cuda.md's
# runbook (its command, carry and timeout_s rows), builds what the GPU machine receives in a new
# folder (the working tree's tracked files and the untracked ones git does not ignore, no .git,
# plus every carried path) with no file executable (the copy to the machine may drop the bits),
# sets OUT to an empty folder as the device tool does, and runs the runbook's command there
# verbatim with --dry-run. Then once more with --fail-nccl --four, into another OUT: the 2-rank
# NCCL steps fail by request, and every step that needs 2 ranks (the opt-in 4-device one too)
# must be skipped with the reason, the performance steps planned on 1 device, and what is left
# must fit the budget. Both runs build
# in one folder of the rehearsal's own (GPU_CHECK_BUILD_DIR; the call's own is a fresh one under
# /tmp), so the second configures and builds nothing anew.
#
#   bench/gpu-rehearse.sh [--nccl DIR] [--keep]
#
# --nccl DIR  the carried .nccl/ is a copy of DIR (as the runbook's `cp -r` makes it), not the
#             checkout's own .nccl/ (which CI's fresh clone lacks)
# --keep      leave the rehearsal's folder (its path is printed)
#
# It fails when the command fails or leaves a step that is not pass, planned or not-run for want
# of a GPU, or a step whose limit comes without its reasoning; when the summary does not name the
# commit, whether it was dirty and the NCCL loaded; when what comes back breaks the device tool's
# limits (at most 8 plain files, no more than 2 folders deep) or lacks the summary; when what
# travels exceeds 64 MiB; when the check's budget does not end it inside the call's timeout_s;
# or when the run with --fail-nccl does not skip as it must. Exit status 0 when it passes.
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

# What the checkout is, for the summary there (no .git travels); nothing written into the
# checkout before it is known, so that `git status` sees the tree as it is.
if ! source_text=$(bash "$SRC/bench/gpu-check-source.sh" "$SRC"); then
  echo "gpu-rehearse: cannot tell what $SRC is (bench/gpu-check-source.sh)"
  exit 1
fi
printf '%s\n' "$source_text" >"$SRC/.gpu-check-source" ||
  { echo "gpu-rehearse: cannot write $SRC/.gpu-check-source"; exit 1; }
echo "gpu-rehearse: wrote .gpu-check-source: $(sed -n 's/^describe //p' "$SRC/.gpu-check-source")"

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
# The copy to the GPU machine may not keep executable bits: none here either, so that the
# command and what it runs must do without them.
find "$tree" -type f -perm /111 -exec chmod a-x {} +
kib=$(du -sk "$tree" | cut -f1)
echo "gpu-rehearse: $((kib / 1024)) MiB travel: the tree and ${CARRIED[*]}"
((kib <= 64 * 1024)) || fail "$((kib / 1024)) MiB travel, more than the device tool's 64 MiB"
((failures)) && exit 1

# The command verbatim, in the received tree, with OUT set and none of this shell's settings
# of the check but the build folder; --dry-run appended (and --fail-nccl for the second run).
dry() { # out extra-args...
  local o=$1
  shift
  (cd "$tree" && env -u GPU_CHECK_NCCL -u GPU_CHECK_BUDGET_S -u GPU_CHECK_FOUR \
    GPU_CHECK_BUILD_DIR="$tmp/build" OUT="$o" bash -c "$COMMAND --dry-run $*")
}
# What comes back: plain files, at most 8, no more than 2 folders deep, with the summary.
back() { # out
  local o=$1 count odd deep f
  count=$(find "$o" -type f | wc -l)
  ((count <= 8)) || fail "$count files in OUT, more than the 8 that come back: $(cd "$o" && find . -type f)"
  odd=$(find "$o" -mindepth 1 ! -type f ! -type d)
  [ -z "$odd" ] || fail "OUT holds what is not a plain file (does not come back): $odd"
  deep=$(find "$o" -mindepth 3 -type d)
  [ -z "$deep" ] || fail "OUT has folders deeper than 2: $deep"
  for f in summary.md summary.json; do [ -s "$o/$f" ] || fail "OUT lacks $f"; done
}

echo "gpu-rehearse: in $tree: OUT=$out; $COMMAND --dry-run"
dry "$out"
rc=$?
[ "$rc" = 0 ] || fail "the command exited $rc"
back "$out"
if [ -s "$out/summary.json" ]; then
  python3 - "$out/summary.json" "$out/summary.md" "$TIMEOUT_S" <<'PY' || fail "the summary's verdict (above)"
import json, re, sys
s = json.load(open(sys.argv[1]))
md = open(sys.argv[2]).read().splitlines()
timeout = int(sys.argv[3])
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
# The summary's top names the source and the NCCL loaded, where the machine has no .git.
src = s.get("source", {})
if not re.fullmatch(r"[0-9a-f]{40}", src.get("commit", "")) or src.get("dirty") not in ("yes", "no") \
        or not re.fullmatch(r"[0-9a-f]{64}", src.get("status_sha256", "")):
    bad.append("the source is not named: %r" % src)
if "from .gpu-check-source" not in src.get("description", ""):
    bad.append("the source does not come from the carried .gpu-check-source: %r" % src.get("description"))
if not re.match(r"\d+\.\d+\.\d+, from /", s.get("nccl_loaded", "")):
    bad.append("the NCCL loaded is not named: %r" % s.get("nccl_loaded"))
top = "\n".join(md[:4])
for want in ("Source: commit " + src.get("commit", "?"), "NCCL loaded: " + s.get("nccl_loaded", "?")):
    if want not in top:
        bad.append("summary.md's top lacks %r" % want)
for b in bad:
    print("  step or verdict not as it must be:", b)
print("gpu-rehearse: %d steps: %d planned, %d passed (checks), budget %d s, plan %d s, timeout_s %d"
      % (len(s["steps"]), s["planned"], s["passed"], s["budget_s"], s["plan_s"], timeout))
print("gpu-rehearse: " + md[2].strip())
print("gpu-rehearse: " + md[3].strip())
sys.exit(1 if bad else 0)
PY
fi
count=$(find "$out" -type f | wc -l)
files=$(cd "$out" && ls | tr '\n' ' ')

# Once more with the 2-rank NCCL steps failing by request: every step that needs 2 ranks (the
# opt-in one of 4 devices too) is skipped, saying why, the performance steps are planned on 1
# device, and what is left fits the budget well.
gate=$tmp/out-gate
mkdir -p "$gate"
echo "gpu-rehearse: in $tree: OUT=$gate; $COMMAND --dry-run --fail-nccl --four"
dry "$gate" --fail-nccl --four
rc=$?
[ "$rc" = 1 ] || fail "the command with --fail-nccl --four exited $rc, want 1 (the steps it fails)"
back "$gate"
if [ -s "$gate/summary.json" ]; then
  python3 - "$gate/summary.json" <<'PY' || fail "the run with --fail-nccl --four (above)"
import json, sys
s = json.load(open(sys.argv[1]))
steps = {x["name"]: x for x in s["steps"]}
bad = []
for n in ("nccl-2", "nccl-2-nocumem"):
    st = steps.get(n, {})
    if st.get("status") != "fail" or "--fail-nccl" not in st.get("note", ""):
        bad.append("%s: %s (%s), want fail by --fail-nccl" % (n, st.get("status"), st.get("note")))
needs_two = [n for n in steps if n.endswith(("-2", "-4")) and not n.startswith("nccl-")]
needs_two.append("allreduce")
if "gpu-coll-4" not in needs_two:
    bad.append("the opt-in gpu-coll-4 is not in the plan with --four")
for n in needs_two:
    st = steps[n]
    if st["status"] != "not-run" or "nccl-2" not in st["note"]:
        bad.append("%s: %s (%s), want not-run naming nccl-2" % (n, st["status"], st["note"]))
for n in ("step-mlp-1024", "step-mlp", "step-gpt-mini"):
    st = steps.get(n, {})
    if st.get("status") != "planned" or " --devices 1 " not in st.get("command", "") + " ":
        bad.append("%s: %s with %r, want planned on 1 device" % (n, st.get("status"), st.get("command")))
for n, st in steps.items():
    if n in needs_two or n in ("nccl-2", "nccl-2-nocumem"):
        continue
    if not (st["status"] in ("pass", "planned") or (st["status"] == "not-run" and st["note"] == "no GPU")):
        bad.append("%s: %s (%s)" % (n, st["status"], st["note"]))
if s.get("result") != "dry-run-fail" or s.get("failed") != 2:
    bad.append("result %r with %r failed, want dry-run-fail with the 2 forced" % (s.get("result"), s.get("failed")))
# What is left of the plan (the limits of the steps that run) against the budget less its reserve.
room = s["budget_s"] - s["reserve_s"]
if s["plan_run_s"] > room:
    bad.append("the steps left take up to %d s, more than the %d s of the budget" % (s["plan_run_s"], room))
for b in bad:
    print("  with --fail-nccl --four, not as it must be:", b)
print("gpu-rehearse: with --fail-nccl --four: %d steps skipped for want of 2 ranks; the rest take up to %d s"
      " of the budget's %d s (%d s in the full plan)" % (len(needs_two), s["plan_run_s"], room, s["plan_s"]))
sys.exit(1 if bad else 0)
PY
fi

if ((failures)); then
  echo "gpu-rehearse: $failures failed"
  exit 1
fi
echo "gpu-rehearse: the runbook's call passes its rehearsal ($count files back: $files)"
