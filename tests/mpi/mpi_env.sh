# shellcheck shell=bash disable=SC2034,SC2154
# mpi_env.sh: what the mpi suite's scripts share (sourced): Open MPI's settings for this machine
# and the helpers that run mpirun bounded and report. Needs $mpirun.
# Open MPI as root, more processes than cores, and no network: shared memory between processes
# (and no cross-memory attach, which containers often forbid).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_plm_rsh_agent=
export PMAP_SPIN_US=${PMAP_SPIN_US:-50}
command -v "$mpirun" >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# bounded LIMIT_S MPIRUN_ARGS...: mpirun, killed after LIMIT_S; output in $out, its status
# returned, its wall time in $took (seconds).
bounded() {
  local limit=$1 t0=$SECONDS
  shift
  timeout -k 5 "$limit" "$mpirun" --oversubscribe "$@" >"$out" 2>&1
  local rc=$?
  took=$((SECONDS - t0))
  return $rc
}

# verdict OK MESSAGE: records a failure (printing $out) unless OK is 0.
verdict() {
  if [ "$1" -eq 0 ]; then
    echo "ok: $2 (${took} s)"
  else
    echo "FAIL: $2 (${took} s):"
    cat "$out"
    fail=1
  fi
}

# skip_if_no_mpi: exit 77 when the program said SKIP (a build without MPI).
skip_if_no_mpi() {
  if grep -q '^SKIP' "$out"; then cat "$out"; exit 77; fi
}
