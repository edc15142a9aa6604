#!/usr/bin/env bash
# Extract Horovod's examples (examples/pytorch, tensorflow2, keras, mxnet) from a Horovod checkout into
# .horovod-examples/ (git-ignored: Horovod's code stays out of this repository), for
# tests/frameworks/test_horovod_examples.py, and print the variable that test reads.
#   scripts/horovod-examples.sh PATH      PATH: a Horovod clone (work tree) or a bare git directory
#   scripts/horovod-examples.sh           clones github.com/horovod/horovod (shallow) into .horovod-examples/repo
set -euo pipefail
cd "$(dirname "$0")/.."
out=.horovod-examples
source=${1:-}
if [ -z "$source" ]; then
  if [ ! -d "$out/repo" ]; then
    git clone -q --depth 1 https://github.com/horovod/horovod.git "$out/repo"
  fi
  source=$out/repo
fi
if [ -d "$source/.git" ] || [ -f "$source/.git" ]; then
  gitdir=$(git -C "$source" rev-parse --absolute-git-dir)
elif git --git-dir="$source" rev-parse --git-dir >/dev/null 2>&1; then
  gitdir=$source
else
  echo "horovod-examples.sh: $source: expected a Horovod clone or a bare git directory" >&2
  exit 2
fi
if ! git --git-dir="$gitdir" cat-file -e HEAD:examples/pytorch/pytorch_mnist.py 2>/dev/null; then
  echo "horovod-examples.sh: $source: no examples/pytorch/pytorch_mnist.py at HEAD: not a Horovod repository" >&2
  exit 2
fi
rm -rf "$out/examples"
mkdir -p "$out"
git --git-dir="$gitdir" archive HEAD examples/pytorch examples/tensorflow2 examples/keras examples/mxnet \
  | tar -x -C "$out"
echo "export HPCVOD_HOROVOD_EXAMPLES=$PWD/$out/examples   # Horovod $(git --git-dir="$gitdir" rev-parse --short HEAD)"
