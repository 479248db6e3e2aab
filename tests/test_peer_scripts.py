"""The peer-comparison scripts: MinAtar's agents observed episode by episode, and their curve read back."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("minatar")
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# An agent in the examples' shape: it steps minatar.Environment and keeps its own score.
AGENT = '''
import argparse, json, random
from minatar import Environment
p = argparse.ArgumentParser(); p.add_argument("-g"); p.add_argument("-o"); a = p.parse_args()
env, rng, returns, G = Environment(a.g), random.Random(3), [], 0.0
env.reset()
for _ in range(3000):
    r, done = env.act(rng.randrange(6))
    G += r
    if done:
        returns.append(G); G = 0.0; env.reset()
json.dump(returns, open(a.o, "w"))
'''


def test_minatar_episodes_logs_every_episode_the_agent_plays_without_changing_it(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    out = tmp_path / "breakout_dqn_s1.minatar.csv"
    subprocess.run([sys.executable, str(SCRIPTS / "minatar_episodes.py"), str(out), str(agent),
                    "-g", "breakout", "-o", str(tmp_path / "own.json")], check=True, timeout=120)
    import json
    own = json.loads((tmp_path / "own.json").read_text())
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(own) > 20 and [float(r["return"]) for r in rows] == own
    frames = [int(r["frames"]) for r in rows]
    assert frames == sorted(frames) and frames[-1] <= 3000
    assert all(float(r["seconds"]) >= 0 for r in rows)

    # peer_curves reads the CSV beside the log as a 20-episode mean, as it reads seedlocal's runs.
    (tmp_path / "breakout_dqn_s1.minatar.log").write_text("start: ...\n")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import peer_curves
    finally:
        sys.path.remove(str(SCRIPTS))
    run = peer_curves.read_minatar_log(tmp_path / "breakout_dqn_s1.minatar.log", window=20)
    assert run.env_id == "MinAtar/Breakout-v0" and run.algo == "dqn"
    assert len(run.rows) == len(own) - 19
    assert run.rows[-1]["return_mean20"] == pytest.approx(sum(own[-20:]) / 20, abs=1e-3)
    assert run.rows[-1]["steps"] == frames[-1]

    # A CSV it wrote reads back as the same run, so a curve outlives its run folder.
    saved = tmp_path / "minatar_MinAtar_Breakout-v0_minatar_dqn_s1.csv"
    peer_curves.write_csv(run.rows, saved)
    again = peer_curves.read_run(saved, prefix="minatar_")
    assert (again.system, again.algo, again.env_id, again.seed) == ("minatar", "dqn", "MinAtar/Breakout-v0", "1")
    assert [r["return_mean20"] for r in again.rows] == [r["return_mean20"] for r in run.rows]
    assert [r["steps"] for r in again.rows] == [r["steps"] for r in run.rows]


def test_minatar_episodes_refuses_a_call_without_an_agent(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPTS / "minatar_episodes.py"), str(tmp_path / "x.csv")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "usage: minatar_episodes.py [--zero-grad-in-place] OUT.csv AGENT.py" in r.stderr


# AC_lambda.py's pattern: zero the gradients, back-propagate a loss one head does not touch, read every .grad.
GRAD_AGENT = '''
import argparse, json, torch
p = argparse.ArgumentParser(); p.add_argument("-o"); a = p.parse_args()
net = torch.nn.ModuleDict({"policy": torch.nn.Linear(3, 2), "value": torch.nn.Linear(3, 1)})
net["value"](torch.ones(1, 3)).sum().backward()
net.zero_grad()
net["policy"](torch.ones(1, 3)).sum().backward()
json.dump([None if q.grad is None else q.grad.abs().sum().item() for q in net["value"].parameters()], open(a.o, "w"))
'''


@pytest.mark.parametrize("flag, expected", [([], [None, None]), (["--zero-grad-in-place"], [0.0, 0.0])])
def test_zero_grad_in_place_gives_an_agent_torch_1s_zero_grad(tmp_path, flag, expected):
    """With the flag, ``zero_grad()`` leaves zeros (torch 1.x), not None: the
    one change AC_lambda.py needs to run on torch 2.x; without it, torch's own."""
    import json

    agent = tmp_path / "agent.py"
    agent.write_text(GRAD_AGENT)
    subprocess.run([sys.executable, str(SCRIPTS / "minatar_episodes.py"), *flag, str(tmp_path / "x.csv"), str(agent),
                    "-o", str(tmp_path / "grads.json")], check=True, timeout=120)
    assert json.loads((tmp_path / "grads.json").read_text()) == expected
