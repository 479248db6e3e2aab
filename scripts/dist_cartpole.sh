#!/bin/bash
# docs/distributed.md, "Measured": 1 process against 2 gloo ranks (1 worker each) on CartPole-v1, to a 20-episode
# mean of 475, seeds 1 and 2; wall-clock per run and the summary's frames/s (frames / training seconds).
# Usage: scripts/dist_cartpole.sh [OUT_DIR]   (run under an exclusive lock on a shared machine)
set -u
OUT=${1:-/tmp/dist-measure}
PY=${PYTHON:-python}
rm -rf "$OUT"
for seed in 1 2; do
  for learners in 1 2; do
    t0=$(date +%s.%N)
    $PY -m seedlocal train vtrace --env.seed "$seed" --learners "$learners" --stop-at-return 475 \
      --total-steps 600000 --log-dir "$OUT" --run-name "l${learners}_s${seed}" --no-progress > "$OUT.l${learners}_s${seed}.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "learners=$learners seed=$seed rc=$rc wall_s=$(echo "$t1 - $t0" | bc)"
    $PY -c "
import json; s=json.load(open('$OUT/l${learners}_s${seed}/summary.json'))
print('  steps_to_target', s['steps_to_target'], 'steps', s['steps'], 'seconds', s['seconds'], 'frames/s %.0f' % (s['frames']/s['seconds']), 'updates', s['updates'])"
  done
done
