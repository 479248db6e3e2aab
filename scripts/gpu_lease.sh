#!/usr/bin/env bash
# One short GPU lease (15 device-minutes, start-up included) spent in issue 43's order: the parts named on the
# command line run one after another, each under its own time limit, each writing its log into OUT (the device
# machine sends back at most 8 files, 2 folders deep, so every part keeps to one or two files).
#
#   curve    seedlocal train vtrace --env.id Pong-v5, as a user types it (seed 1, the preset and its machine sizing
#            picked by themselves), for at most CURVE_S seconds start-up included, stopped at a 20-episode mean of
#            +18 (--stop-at-return 18 changes no learning); curve.log (its first lines say what was sized, its
#            summary.json is appended), curve.csv / curve.png (minutes from the process's start), curve.tfevents,
#            curve_gpu.log (nvidia-smi every 5 s). CURVE_SEED (default 1) and CURVE_ARGS (a candidate default's
#            options, e.g. "--pipeline.cuda-graphs" or "--algo.sync off") make the tuning curves of later leases
#   ceiling1 raw envpool's best at all of the box's threads (seedlocal bench --raw-ceiling --ceiling-threads N) on
#            single frames, what V-trace and R2D2 step: ceiling1.log
#   ceiling4 the same on envpool's stack of 4, what the GA steps: ceiling4.log
#   r2d2     seedlocal train r2d2 --preset atari --env.id Pong-v5, sized, TRAIN_S seconds: r2d2.log
#   ga       seedlocal train ga --env.id Pong-v5, sized (P >= 256 Nature CNNs), TRAIN_S seconds: ga.log
#   pytest   python -m pytest -m cuda over every test file (the 2-rank gloo tests on one GPU included): pytest.log
#   graphs   the curve's command for GRAPHS_S seconds without, then with --pipeline.cuda-graphs: graphs_off.log,
#            graphs_on.log (frames/s from the progress lines past start-up)
#
# On the lent machine, after `bash ../shared/tools/device-kit.sh` and `bash scripts/device_extra_wheels.sh` here,
# with carry [".whl", ".assets"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
#     && export PYTHONPATH=$PWD/.site:$PWD ENVPOOL_ASSETS_PATH=$PWD/.assets && bash scripts/gpu_lease.sh $OUT curve ceiling1 r2d2
# then, at once (the machine stays warm 30 s):  ... && bash scripts/gpu_lease.sh $OUT ceiling4 ga pytest graphs
# Here, without a GPU, DEVICE=cpu CURVE_S=20 TRAIN_S=8 GRAPHS_S=8 runs the same parts on the CPU (the mechanics only).
set -u
out=${1:?usage: gpu_lease.sh OUT part [part ...] (parts: curve ceiling1 ceiling4 r2d2 ga pytest graphs)}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
dev=${DEVICE:-cuda}
cores=$(nproc)
curve_s=${CURVE_S:-340}
train_s=${TRAIN_S:-40}
graphs_s=${GRAPHS_S:-30}
export PYTHONUNBUFFERED=1
runs=$(mktemp -d /tmp/gpu_lease.XXXXXX)
trap 'rm -rf "$runs"' EXIT
devflag=(); [ "$dev" = cuda ] || devflag=(--pipeline.device "$dev")

stamp() { echo "== $1 at $(date -u +%FT%T.%3NZ) (epoch $(date +%s.%N)), $cores cores, device $dev"; }

# A trainer for at most $2 seconds of training, its log and summary.json into $out/$1.log, its run folder deleted.
train() {
  local name=$1 seconds=$2; shift 2
  local log="$out/$name.log"
  stamp "$name" >> "$log"
  echo "\$ seedlocal $* --seconds $seconds --log-dir RUNS/$name" >> "$log"
  timeout -k 20 $((${seconds%.*} + 60)) "$py" -m seedlocal "$@" "${devflag[@]}" --seconds "$seconds" \
    --log-dir "$runs/$name" >> "$log" 2>&1
  echo "== $name exit $? at epoch $(date +%s.%N)" >> "$log"
  for s in "$runs/$name"/*/summary.json; do [ -f "$s" ] && { echo "== summary.json"; cat "$s"; echo; } >> "$log"; done
}

part_curve() {
  local smi=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw --format=csv \
      -l 5 > "$out/curve_gpu.log" 2>&1 & smi=$!
  fi
  local t0; t0=$(date +%s.%N)
  # shellcheck disable=SC2086  # CURVE_ARGS: a candidate default's options, word-split on purpose
  train curve "$curve_s" train vtrace --env.id "${CURVE_ENV:-Pong-v5}" --env.seed "${CURVE_SEED:-1}" \
    --stop-at-return 18 ${CURVE_ARGS:-}
  [ -n "$smi" ] && kill "$smi" 2>/dev/null
  "$py" scripts/gpu_suite.py --curve-post "$runs/curve" "$out" 18 >> "$out/curve.log" 2>&1
  "$py" - "$runs/curve" "$out" "$t0" >> "$out/curve.log" 2>&1 <<'EOF'
# Minutes to +18 from the process's start (the curve's own clock starts at its first logged point).
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "scripts")
import atari_curve
run_dir, out, t0 = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
events = sorted(run_dir.glob("*/events.out.tfevents.*"), key=lambda p: p.stat().st_size)
if events:
    shutil.copyfile(events[-1], out / "curve.tfevents")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(events[-1].parent), size_guidance={"scalars": 0}); ea.Reload()
    pts = ea.Scalars("charts/return_mean20") if "charts/return_mean20" in ea.Tags()["scalars"] else []
    hit = next((p for p in pts if p.value >= 18), None)
    first = min((e.wall_time for t in ea.Tags()["scalars"] for e in ea.Scalars(t)), default=t0)
    print(json.dumps({"start_up_s": round(first - t0, 1), "points": len(pts),
                      "final_return_mean20": pts[-1].value if pts else None,
                      "minutes_to_18_from_start": round((hit.wall_time - t0) / 60, 2) if hit else None,
                      "steps_at_18": hit.step if hit else None}))
EOF
}

part_ceiling() {  # $1: envpool's frames per observation
  local log="$out/ceiling$1.log"
  stamp "ceiling, frame stack $1" >> "$log"
  timeout -k 10 "${CEIL_TIMEOUT:-100}" "$py" -m seedlocal bench --env Pong-v5 --raw-ceiling --frame-stack "$1" \
    --env-threads "$cores" --ceiling-threads "$cores" --num-workers 4 --envs-per-worker 32 \
    --seconds "${CEIL_S:-1}" --warmup 0.3 >> "$log" 2>&1
  echo "== exit $?" >> "$log"
}
part_ceiling1() { part_ceiling 1; }
part_ceiling4() { part_ceiling 4; }

part_r2d2() { train r2d2 "$train_s" train r2d2 --preset atari --env.id Pong-v5 --total-steps 0; }
part_ga() { train ga "$train_s" train ga --env.id Pong-v5 --generations 0; }

part_pytest() {
  stamp pytest >> "$out/pytest.log"
  timeout -k 10 "${PYTEST_S:-170}" "$py" -m pytest -p no:cacheprovider -n 0 -m cuda -v --tb=short -rfEs \
    --timeout 120 --durations 8 tests >> "$out/pytest.log" 2>&1
  echo "== exit $?" >> "$out/pytest.log"
}

part_graphs() {  # the user's default, as the curve ran it, without then with CUDA graphs
  train graphs_off "$graphs_s" train vtrace --env.id Pong-v5
  train graphs_on "$graphs_s" train vtrace --env.id Pong-v5 --pipeline.cuda-graphs
}

for part in "$@"; do  # every name checked before the lease's time goes into the first part
  case $part in curve|ceiling1|ceiling4|r2d2|ga|pytest|graphs) ;; *)
    echo "gpu_lease: unknown part '$part' (parts: curve ceiling1 ceiling4 r2d2 ga pytest graphs)" >&2; exit 2 ;;
  esac
done
status=0
for part in "$@"; do
  echo "gpu_lease: $part (at $(date -u +%T))"; "part_$part" || status=1
done
echo "gpu_lease: done at $(date -u +%T)"; ls -la "$out"
exit $status
