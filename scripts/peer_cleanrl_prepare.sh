#!/usr/bin/env bash
# CleanRL's ppo_atari_envpool.py into .peer/cleanrl/ (git-ignored), for scripts/peer_cleanrl_atari.py, the peer
# of issue 33's Pong comparison. CleanRL's code stays out of the repository; the device `run` tool carries
# .peer like .whl and .assets (a few tens of KB).
#
#   bash scripts/peer_cleanrl_prepare.sh <a clone of github:vwxyzjn/cleanrl, or its bare git directory>
#
# The script at CleanRL commit fe8d8a03c41a7ef5b523e2e354bd01c363e786bb (unchanged there since 35896b1f,
# "Refactor to use tyro", 2023-11-27), with CleanRL's LICENSE beside it; its sha256 is checked.
set -euo pipefail
src=${1:?usage: scripts/peer_cleanrl_prepare.sh <cleanrl clone or git dir>}
commit=fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
want=d1672d9822929ef21c1ea0b63e853f330387892550b924abf32d6f755d6a97c8
cd "$(git rev-parse --show-toplevel)"
if [ -d "$src/.git" ]; then gitdir="$src/.git"; else gitdir="$src"; fi
mkdir -p .peer/cleanrl
git --git-dir="$gitdir" show "$commit:cleanrl/ppo_atari_envpool.py" > .peer/cleanrl/ppo_atari_envpool.py
git --git-dir="$gitdir" show "$commit:LICENSE" > .peer/cleanrl/LICENSE
got=$(sha256sum .peer/cleanrl/ppo_atari_envpool.py | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "peer_cleanrl_prepare: sha256 $got, expected $want" >&2; exit 1; }
echo "CleanRL's ppo_atari_envpool.py ($commit) is in .peer/cleanrl/; run: python scripts/peer_cleanrl_atari.py --seconds S"
