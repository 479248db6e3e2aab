#!/usr/bin/env bash
# Wheels the GPU suite needs beyond ../shared/tools/device-kit.sh's, into the same .whl/ folder
# (run after it, from the project root): the test runner (pytest and what it imports, pytest-timeout,
# psutil for tests/conftest.py), lz4 (R2D2's compressed replay, on in its Atari preset) and
# cloudpickle (gymnasium imports it). About 3 MB: with device-kit's ~52 MB and the tracked tree the
# carry stays under the device's 64 MiB. The lent machine has no registry; scripts/gpu_suite.py's first
# step names whatever is still missing there.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -d .whl ] || { echo "run bash ../shared/tools/device-kit.sh first (it creates .whl/)" >&2; exit 2; }
py=${PYTHON:-python3}
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl lz4 psutil pytest pluggy iniconfig packaging pytest-timeout cloudpickle
du -sh .whl
