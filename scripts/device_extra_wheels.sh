#!/usr/bin/env bash
# Wheels the GPU suite needs beyond ../shared/tools/device-kit.sh's, into the same .whl/ folder
# (run after it, from the project root). Only lz4 (R2D2's compressed replay, on in its Atari preset):
# the lent machine's image already has pytest with its plugins, pytest-timeout, psutil, cloudpickle,
# pillow and matplotlib (../.library/device/KINDS.md), and carrying a second pytest would put a newer
# runner in front of the machine's own plugins (xdist, cov, ...), which load into it by themselves.
# The lent machine has no registry; scripts/gpu_suite.py's first step names whatever is still missing.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -d .whl ] || { echo "run bash ../shared/tools/device-kit.sh first (it creates .whl/)" >&2; exit 2; }
py=${PYTHON:-python3}
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl lz4
du -sh .whl
