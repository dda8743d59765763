#!/usr/bin/env bash
# setup.sh: installs what pmap needs to build on Debian (compiler, Meson, Ninja, oneDNN and
# OpenBLAS for the CPU GEMM, chosen between per machine at run time, Python for the CLI test,
# Open MPI for contexts across processes and the mpi test suite). Installs only what is missing;
# needs root or sudo.
set -euo pipefail
pkgs=(gcc libc6-dev pkg-config meson ninja-build libdnnl-dev libopenblas-dev python3 libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
