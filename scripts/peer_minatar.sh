#!/usr/bin/env bash
# The MinAtar side of the MinAtar comparison: the authors' own example agents
# (kenjyoung/MinAtar examples/dqn.py or examples/AC_lambda.py), unmodified, on
# one game for a wall-clock budget, their -v log kept as
# OUT/<game>_<agent>_s<n>.minatar.log and every episode they play as
# OUT/<game>_<agent>_s<n>.minatar.csv, for scripts/peer_curves.py.
#
#   scripts/peer_minatar.sh GAME AGENT SECONDS OUT [RUN]
#   scripts/peer_minatar.sh breakout dqn 900 /work/peers/runs/minatar 1
#   python scripts/peer_curves.py /work/peers/runs/minatar runs/minatar_* --out docs/figures --prefix minatar_
#
# GAME is MinAtar's name (breakout, space_invaders, freeway, asterix,
# seaquest); AGENT dqn or AC_lambda (AC_lambda with torch 1.x's zero_grad,
# its one incompatibility with torch 2.x: see scripts/minatar_episodes.py).
# The scripts take no seed (each run draws
# its own), so RUN only names the log. They play MinAtar's v0 envs (all 6
# actions, sticky actions 0.1, difficulty ramping), as their published curves
# did; seedlocal plays v1 (the minimal action set, otherwise the same game).
# They stop at 5M frames; SECONDS (timeout) stops them sooner, and their
# log then ends at the last 1,000th episode before it (the log is written
# every 1,000 episodes: frames, an exponential average of the returns, and
# seconds per frame).
#
# Run it with nothing else on the machine, one run after another, as the
# seedlocal side: the wall-clock axis is the point. The load average is
# printed at the start and the end.
#
# The checkout (outside the repository: MinAtar's code is not part of
# seedlocal; pass MINATAR_DIR to use another folder) is kenjyoung/MinAtar at
# 4241f24685622cfb52f843cab9bbcf385a53484a (version 1.0.15, the release on
# PyPI), run by the python on PATH (activate seedlocal's venv: torch and
# minatar are what it imports) or by $PYTHON.
set -euo pipefail
game=${1:?GAME (breakout, space_invaders, freeway, ...)}
agent=${2:?AGENT (dqn or AC_lambda)}
seconds=${3:?SECONDS}
out=${4:?OUT folder}
run=${5:-1}
dir=${MINATAR_DIR:-/work/peers/MinAtar}
script="$dir/examples/$agent.py"
[ -f "$script" ] || { echo "no $script: clone kenjyoung/MinAtar into $dir (or set MINATAR_DIR)" >&2; exit 2; }
mkdir -p "$out"
log="$out/${game}_${agent}_s${run}.minatar.log"
echo "start: $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg); $script -g $game for ${seconds}s" | tee "$log"
# timeout's 124 is the budget running out, the expected end.
# scripts/minatar_episodes.py runs the agent as it is and writes each episode it plays (frames, seconds,
# return) to <name>.minatar.csv: the -v log's every-1,000th-episode lines never come on Freeway or
# SpaceInvaders within minutes.
here=$(cd "$(dirname "$0")" && pwd)
# AC_lambda.py reads .grad after zero_grad() as torch 1.x left it (zeros, not None): see minatar_episodes.py.
compat=(); [ "$agent" = AC_lambda ] && compat=(--zero-grad-in-place)
timeout "$seconds" "${PYTHON:-python}" "$here/minatar_episodes.py" "${compat[@]}" "$out/${game}_${agent}_s${run}.minatar.csv" \
    "$script" -g "$game" -v -o "$out/${game}_${agent}_s${run}" 2>&1 | tee -a "$log" || true
echo "end: $(date -Is) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
