#!/usr/bin/env bash
# The CleanRL side of the MuJoCo comparison: CleanRL's ppo_continuous_action.py,
# unmodified, for one env, seed and step budget, writing its TensorBoard run
# under OUT/runs/<env>__ppo_continuous_action__<seed>__<unix time>/.
#
#   scripts/peer_cleanrl_mujoco.sh ENV SEED STEPS OUT [more CleanRL flags]
#   scripts/peer_cleanrl_mujoco.sh HalfCheetah-v5 1 1000000 /work/peers/runs/cleanrl
#   python scripts/peer_curves.py /work/peers/runs/cleanrl/runs runs/<seedlocal runs> --out docs/figures --prefix mujoco_
#
# Run it with nothing else on the machine, and the seedlocal side after it (or
# before), never both at once: the wall-clock axis is the point. The load
# average is printed at the start and the end so the log shows whether the
# machine was shared. The console output goes to OUT/<env>_s<seed>.log too.
#
# Env ids: CleanRL's script needs gymnasium 0.29 (see below), which has the
# MuJoCo -v4 ids and no -v5, so a -v5 id given here runs as -v4 (said in one
# line). The MuJoCo model files are identical (gymnasium 0.29.1's
# half_cheetah.xml and hopper.xml = gymnasium 1.x's v5 = envpool's
# *_envpool.xml, comments aside) and the venv's MuJoCo is the release that
# envpool 1.2.5 embeds (3.6.0). HalfCheetah-v4 = HalfCheetah-v5 in dynamics,
# observation, reward and reset. Hopper-v4 differs from Hopper-v5 in one
# term: v4 pays the healthy reward (+1) on the step that ends an episode by
# falling, v5 does not (envpool's legacy_healthy_reward), so a CleanRL Hopper
# episode that falls scores 1 more than the same episode would in v5;
# episodes cut at 1,000 steps score the same. Checked from a noiseless reset
# (reset_noise_scale=0) with the same 300 random actions: envpool's
# HalfCheetah-v5 and gymnasium 0.29.1's HalfCheetah-v4 on mujoco 3.6.0 give
# bit-identical observations for all 300 steps and rewards equal to float32
# rounding; Hopper the same up to its fall at step 27, where v4's last reward
# is 1 higher. (Gymnasium 1.4's v5 on mujoco 4.0.0 drifts from both within
# 300 HalfCheetah steps: the engine release matters, hence mujoco==3.6.0.)
#
# Why gymnasium 0.29.1 (CleanRL's own pin), not 1.x: on gymnasium >= 1.0 the
# script stops in make_env with "TypeError: TransformObservation.__init__()
# missing 1 required positional argument: 'observation_space'"; past that,
# 1.x vector envs reset on the step after an episode ends and no longer put
# "final_info" in infos, so the script would log no episodic returns and its
# GAE would bootstrap across the reset step.
#
# How /work/peers/cleanrl was made (outside the repository: CleanRL's code is
# not part of seedlocal; pass CLEANRL_DIR to use another folder):
#
#   mkdir -p /work/peers/cleanrl && cd /work/peers/cleanrl
#   # the script at CleanRL commit fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
#   # (github:vwxyzjn/cleanrl; unchanged there since 35896b1f, 2023-11-27;
#   # PyPI's "cleanrl" 0.4.8 is an older gym/pybullet version, not this one):
#   git --git-dir=<clone of vwxyzjn/cleanrl>/.git show \
#       fe8d8a03c41a7ef5b523e2e354bd01c363e786bb:cleanrl/ppo_continuous_action.py > ppo_continuous_action.py
#   git --git-dir=<same> show fe8d8a03c41a7ef5b523e2e354bd01c363e786bb:LICENSE > LICENSE
#   sha256sum ppo_continuous_action.py   # 326dd8678bf9cc51abec833eb551ef2409a3804d604b689e1f0a084eca41f655
#   python -m venv .venv                 # Python 3.11.7, as the project's .venv
#   .venv/bin/pip install torch==2.13.0  # first: the local CPU wheel (unpinned torch pulls CUDA wheels)
#   .venv/bin/pip install gymnasium==0.29.1 mujoco==3.6.0 numpy==1.24.4 tyro==0.5.10 tensorboard "imageio>=2.14.1,<3"
#
# Versions against CleanRL's lock file: gymnasium 0.29.1, numpy 1.24.4, tyro
# 0.5.10 and imageio as CleanRL pins them (gymnasium 0.29.1's MuJoCo envs
# import imageio; numpy 2 breaks its env checker's np.bool8); torch 2.13.0+cpu
# instead of 2.4.1 (the machine's wheel); mujoco 3.6.0 instead of 2.3.3 (the
# engine envpool 1.2.5 embeds); tensorboard 2.21.0 (logging only).
# CleanRL runs on the CPU here (--cuda is on by default and used where
# torch sees a GPU); its torch uses every core, as it would unmodified.
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
env_id=$1 seed=$2 steps=$3 out=$(realpath -m "$4")
shift 4
peer=${CLEANRL_DIR:-/work/peers/cleanrl}
script=$peer/ppo_continuous_action.py
python=$peer/.venv/bin/python
sha=326dd8678bf9cc51abec833eb551ef2409a3804d604b689e1f0a084eca41f655

[ -x "$python" ] || { echo "no venv at $peer/.venv: make it as this script's header says" >&2; exit 1; }
[ -f "$script" ] || { echo "no $script: fetch it as this script's header says" >&2; exit 1; }
if [ "$(sha256sum "$script" | cut -d' ' -f1)" != "$sha" ]; then
    echo "$script is not CleanRL's ppo_continuous_action.py at fe8d8a03 (sha256 differs): refusing to run a modified peer" >&2
    exit 1
fi

case $env_id in
    *-v5)
        run_id=${env_id%-v5}-v4
        echo "peer: $env_id runs as $run_id (gymnasium 0.29.1 has no -v5 ids; same model files and MuJoCo; see this script's header)"
        ;;
    *) run_id=$env_id ;;
esac

mkdir -p "$out"
cd "$out"
log=$out/${run_id}_s${seed}.log
echo "peer: $("$python" -c 'import gymnasium, mujoco, numpy, torch; print(f"gymnasium {gymnasium.__version__}, mujoco {mujoco.__version__}, numpy {numpy.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads)")')" | tee "$log"
echo "peer: load average at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores" | tee -a "$log"
start=$(date +%s)
"$python" "$script" --env-id "$run_id" --seed "$seed" --total-timesteps "$steps" "$@" 2>&1 | tee -a "$log"
echo "peer: done in $(( $(date +%s) - start )) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg); runs in $out/runs" | tee -a "$log"
