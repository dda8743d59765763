#!/usr/bin/env bash
# test_gpu_check_lib.sh: what bench/gpu-check-lib.sh reads out of logs, on logs made up to catch
# the mistakes it must not make: ldd_path (the NCCL a library loads) on a path with spaces and on
# a library not found; log_note (a failed step's note) on a build log whose progress, command
# lines and flags name error.c and -Werror=, on a test's log and on a log naming no failure;
# probe_verdict (the probe's phases) telling a slow start from a hanging wait.
#
#   bench/test_gpu_check_lib.sh        (exit status 0 when every case holds)
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/gpu-check-lib.sh
source "$SRC/bench/gpu-check-lib.sh"
unset PMAP_CUDA_WAIT # the verdicts below set it
failures=0
expect() { # what got want
  if [ "$2" = "$3" ]; then
    echo "ok: $1"
  else
    echo "FAIL: $1: got [$2], want [$3]"
    failures=$((failures + 1))
  fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ldd_out=$(printf '\tlinux-vdso.so.1 (0x00007ffd1000)\n\tlibnccl.so.2 => /tmp/a b/c d/lib/libnccl.so.2 (0x00007f1200000000)\n\tlibcublas.so.13 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0000000000)\n')
expect "ldd_path: a path with spaces" "$(ldd_path "$ldd_out" libnccl)" "/tmp/a b/c d/lib/libnccl.so.2"
expect "ldd_path: a library not found" "$(ldd_path "$ldd_out" libcublas)" ""
expect "ldd_path: a library not listed" "$(ldd_path "$ldd_out" libmpi)" ""

cat >"$tmp/build.log" <<'LOG'
$ ninja -C /tmp/b -j 16 libpmap-cuda.so

ninja: Entering directory `/tmp/b'
[1/80] Compiling C object libpmap.a.p/base_error.c.o
[2/80] Compiling C object libpmap.a.p/base_env.c.o
FAILED: libpmap.a.p/base_env.c.o
cc -Ilibpmap.a.p -Werror=vla -Werror=missing-prototypes -o libpmap.a.p/base_env.c.o -c ../base/env.c
../base/env.c:12:3: error: unknown type name 'foo'
../base/env.c:20:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
LOG
expect "log_note: a failed build, its first compiler error" "$(log_note "$tmp/build.log" 1)" \
  "../base/env.c:12:3: error: unknown type name 'foo'"
printf '$ ninja -C /tmp/b\n[1/3] Compiling C object base_error.c.o\n[2/3] cc -Werror=vla -c ../base/error.c\nninja: build stopped: interrupted by user.\n' \
  >"$tmp/stopped.log"
expect "log_note: no failure named, the last line" "$(log_note "$tmp/stopped.log" 1)" \
  "ninja: build stopped: interrupted by user."
cat >"$tmp/test.log" <<'LOG'
$ env PMAP_GPU_TEST_DEVICES=2 /tmp/b/tests/gpu/test_gpu_coll

all_reduce 4 MB on 2 logical devices: ok (no error: the sums are exact)
FAIL: device 1: all_gather: 3 of 4096 values wrong
gpu_coll: 120 checks, 1 failed
LOG
expect "log_note: a failed test, its count" "$(log_note "$tmp/test.log" 1)" "gpu_coll: 120 checks, 1 failed"
expect "log_note: a test that passed" "$(log_note "$tmp/test.log" 0)" "gpu_coll: 120 checks, 1 failed"
printf '$ pmap-allreduce -d 2\nstarting\nFAIL: forced by --fail-nccl (a test)\n' >"$tmp/forced.log"
expect "log_note: a FAIL line" "$(log_note "$tmp/forced.log" 1)" "FAIL: forced by --fail-nccl (a test)"
cat >"$tmp/meson.log" <<'LOG'
$ meson setup /tmp/b /src -Dcuda=enabled
The Meson build system
../meson.build:120:2: ERROR: Dependency "nccl" not found, tried pkgconfig
LOG
expect "log_note: Meson's error" "$(log_note "$tmp/meson.log" 1)" \
  '../meson.build:120:2: ERROR: Dependency "nccl" not found, tried pkgconfig'

# The probe's phases: where it ended, and what that says of the waits.
probe_head='phase nccl at 0.00 s: the NCCL library this process loaded
nccl loaded: 23007 (2.30.7) from /x/.nccl/lib/libnccl.so.2
phase start at 0.01 s: CUDA, the context and a cuBLAS handle'
probe_wait="$probe_head
gpus: 1
start: CUDA 3.10 s, context on GPU 0 9.80 s, cuBLAS handle 0.40 s
module loading: eager (CUDA_MODULE_LOADING EAGER)
phase blocking-sync wait at 13.40 s: a kernel of 0.1 s, then a blocking-sync wait behind it"
verdict_of() { # case rc log-text
  printf '%s\n' "$3" >"$tmp/probe.log"
  NOTES=() PROBE_VERDICT="" WAIT_NOTE=""
  (
    probe_verdict "$tmp/probe.log" "$2"
    echo "$PROBE_VERDICT ${PMAP_CUDA_WAIT:-block} ${#NOTES[@]}"
  )
}
expect "probe_verdict: ran to its end" "$(verdict_of end 0 "$probe_wait
blocking-sync wait: works (0.101 s behind a 0.100 s kernel)
phase contexts at 13.60 s: contexts
phase done at 19.00 s: every phase ran")" "ok block 0"
expect "probe_verdict: a wait it gave up on" "$(verdict_of gave-up 0 "$probe_wait
blocking-sync wait: hung: no return within 5 s behind a 0.100 s kernel
phase contexts at 18.40 s: contexts")" "hung poll 1"
expect "probe_verdict: killed in its wait" "$(verdict_of killed-wait 124 "$probe_wait")" "hung poll 1"
expect "probe_verdict: killed while CUDA started" "$(verdict_of slow 124 "$probe_head")" "slow block 1"
expect "probe_verdict: killed in its contexts" "$(verdict_of contexts 124 "$probe_wait
blocking-sync wait: works (0.101 s behind a 0.100 s kernel)
phase contexts at 13.60 s: contexts")" "ok block 1"
expect "probe_verdict: no log (not run)" "$(
  NOTES=()
  probe_verdict "$tmp/none.log" 1
  echo "$PROBE_VERDICT ${#NOTES[@]}"
)" "ok 0"

if ((failures)); then
  echo "test_gpu_check_lib: $failures failed"
  exit 1
fi
echo "test_gpu_check_lib: every case holds"
