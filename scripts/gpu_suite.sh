#!/usr/bin/env bash
# The GPU checklist in one command (issue 20); the steps, budget and files are described in scripts/gpu_suite.py.
#
# On the lent GPU machine: after `bash ../shared/tools/device-kit.sh` and `bash scripts/device_extra_wheels.sh`
# here (lz4 beside device-kit's wheels; the machine has pytest and psutil), one device `run` call with
# carry [".whl", ".assets"], timeout_s 590 and this command (at most 9 minutes; results.jsonl and suite.log come back from $OUT;
# the first run, on an H200, its step times and what it found: docs/gpu.md):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PWD ENVPOOL_ASSETS_PATH=$PWD/.assets && bash scripts/gpu_suite.sh $OUT
# The Pong V-trace learning curve (curve.csv, curve.png where matplotlib exists, curve.tfevents), another call:
#   ... && bash scripts/gpu_suite.sh --curve $OUT
# Without a GPU: the import checks, then one line and exit status 2. The mechanics, on a CPU:
#   bash scripts/gpu_suite.sh --cpu-dry-run /tmp/suite
set -eu
exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_suite.py" "$@"
