"""Run one of MinAtar's example agents, unmodified, and write every episode it plays to a CSV.

    python scripts/minatar_episodes.py OUT.csv /path/to/MinAtar/examples/dqn.py -g freeway -v
    python scripts/minatar_episodes.py --zero-grad-in-place OUT.csv /path/to/MinAtar/examples/AC_lambda.py -g breakout -v

The examples log only every 1,000th episode. On Breakout (episodes of ~20
frames) that is a point every half minute; on Freeway (2,500 frames an
episode) their DQN, at ~170 frames/s on 2 cores, plays about 60 episodes in
ten minutes and logs nothing. This observer wraps ``minatar.Environment.act``,
the one call through which the agents step the game, counts frames and reward
and appends ``frames,seconds,return`` at each episode's end (seconds from the
agent's start). The agent's code, settings and random draws are untouched:
the wrapper calls the original ``act`` and returns what it returned.

``--zero-grad-in-place`` gives the agent the ``Module.zero_grad`` of the
torch it was written for. Since torch 2.0, ``zero_grad()`` sets gradients to
None instead of zeroing them. ``AC_lambda.py`` zeroes the network's
gradients, back-propagates its entropy (which the value head does not touch),
then reads every parameter's ``.grad``: on torch 2.x the value head's is None
and the script stops at its first update with a TypeError. With the flag,
``zero_grad`` defaults to ``set_to_none=False`` again, torch 1.x's default,
which that code assumes: the value head's entropy gradient is zero, as it was
when the authors ran it.
"""

from __future__ import annotations

import csv
import runpy
import sys
import time


def main(argv: list[str]) -> None:
    in_place = bool(argv) and argv[0] == "--zero-grad-in-place"
    argv = argv[1:] if in_place else argv
    if len(argv) < 2 or not argv[1].endswith(".py"):
        raise SystemExit("usage: minatar_episodes.py [--zero-grad-in-place] OUT.csv AGENT.py [agent arguments]")
    out, script, agent_args = argv[0], argv[1], argv[2:]
    import minatar

    if in_place:
        import torch

        zero_grad = torch.nn.Module.zero_grad

        def zero_grad_in_place(self, set_to_none: bool = False) -> None:
            zero_grad(self, set_to_none=set_to_none)

        torch.nn.Module.zero_grad = zero_grad_in_place

    original = minatar.Environment.act
    start = time.monotonic()
    frames, episode_return = 0, 0.0
    f = open(out, "w", newline="", buffering=1)  # line-buffered: a run cut by timeout keeps every episode
    writer = csv.writer(f)
    writer.writerow(["frames", "seconds", "return"])

    def act(self, a):
        nonlocal frames, episode_return
        reward, terminal = original(self, a)
        frames += 1
        episode_return += float(reward)
        if terminal:
            writer.writerow([frames, round(time.monotonic() - start, 2), episode_return])
            episode_return = 0.0
        return reward, terminal

    minatar.Environment.act = act
    sys.argv = [script, *agent_args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        f.close()


if __name__ == "__main__":
    main(sys.argv[1:])
