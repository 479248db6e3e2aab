#!/usr/bin/env python3
"""The peer of issue 33: CleanRL's ``ppo_atari_envpool.py``, unmodified, for a
wall-clock budget, on the same box as seedlocal's Pong curve.

    python scripts/peer_cleanrl_atari.py --seconds 240 [--script PATH] [--log-dir DIR] -- [CleanRL's flags]

CleanRL's code is not part of seedlocal: ``scripts/peer_cleanrl_prepare.sh``
copies the script out of a CleanRL checkout into ``.peer/cleanrl/`` (git
ignores it; the device ``run`` tool carries it like ``.whl``). Its defaults
are kept (8 envs, 128 steps, 10M-step schedule); ``--env-id Pong-v5`` is
added unless the flags after ``--`` name another env.

The shim it needs, and nothing else: the script was written for envpool
0.x's ``env_type="gym"`` (``import gym``; ``reset`` returns the observations,
``step`` four values). envpool 1.x returns a Gymnasium pool for that type
(``reset`` gives ``(obs, info)``, ``step`` five values) and the machine may
have no ``gym`` at all. So before the script runs, ``gym`` is a small module
of our own (a pass-through ``Wrapper`` as old gym's, and Gymnasium's
``spaces``), and ``envpool.make(..., env_type="gym")`` returns the Gymnasium
pool behind the old API (``done = terminated or truncated``, as envpool 0.x
reported it). ``distutils`` is not used by this version of the script.

The shim reads the script's own console lines (``SPS: N`` after each update,
``global_step=..., episodic_return=...`` at each game's end) and, when the
budget runs out or the script ends, prints one JSON line: frames/s (CleanRL's
SPS counts agent steps: x frames per step, 4 on Atari v5), the mean return of
the last 20 games, and the wall-clock minutes (start-up included, as for
seedlocal's curve) at which that mean first reached ``--target``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import runpy
import sys
import threading
import time
import types
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCRIPT = ROOT / ".peer" / "cleanrl" / "ppo_atari_envpool.py"


def old_gym_module() -> types.ModuleType:
    """A ``gym`` with what the script uses of it: ``Wrapper`` and ``spaces``."""
    import gymnasium

    gym = types.ModuleType("gym")

    class Wrapper:
        """Old gym's pass-through wrapper: calls and attributes go to ``env``."""

        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            if name == "env":
                raise AttributeError(name)
            return getattr(self.env, name)

        def reset(self, **kwargs):
            return self.env.reset(**kwargs)

        def step(self, action):
            return self.env.step(action)

    gym.Wrapper = Wrapper
    gym.spaces = gymnasium.spaces
    gym.__version__ = "0.0-seedlocal-shim"
    return gym


class OldStepAPI:
    """envpool 1.x's Gymnasium pool with envpool 0.x's gym API: ``reset``
    returns the observations, ``step`` (obs, reward, done, info)."""

    def __init__(self, env):
        self.__dict__["_env"] = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, **kwargs):
        obs, _ = self._env.reset(**kwargs)
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self._env.step(action)
        return obs, reward, terminated | truncated, info


def install_shim() -> None:
    import envpool

    sys.modules["gym"] = old_gym_module()
    make = envpool.make

    def make_old_gym(task_id, env_type="gym", **kwargs):
        if env_type != "gym":
            return make(task_id, env_type=env_type, **kwargs)
        return OldStepAPI(make(task_id, env_type="gymnasium", **kwargs))

    envpool.make = make_old_gym


class Watch(io.TextIOBase):
    """Standard output, passed through and read: the script's SPS and game ends."""

    def __init__(self, out, frames_per_step: int, target: float, t0: float):
        self.out, self.fps_mult, self.target, self.t0 = out, frames_per_step, target, t0
        self.sps: int | None = None
        self.steps = 0
        self.returns: deque[float] = deque(maxlen=20)
        self.games = 0
        self.reached: tuple[float, int] | None = None  # (minutes, env steps)
        self._buf = ""
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        self.out.write(s)
        with self.lock:
            self._buf += s
            *lines, self._buf = self._buf.split("\n")
            for line in lines:
                self._read(line)
        return len(s)

    def flush(self) -> None:
        self.out.flush()

    def _read(self, line: str) -> None:
        m = re.match(r"SPS:\s*(\d+)", line)
        if m:
            self.sps = int(m.group(1))
            return
        m = re.match(r"global_step=(\d+), episodic_return=\[?(-?[\d.]+)", line)
        if m:
            self.steps = int(m.group(1))
            self.returns.append(float(m.group(2)))
            self.games += 1
            if self.reached is None and len(self.returns) == 20 and sum(self.returns) / 20 >= self.target:
                self.reached = ((time.monotonic() - self.t0) / 60, self.steps)

    def result(self, status: str) -> dict:
        with self.lock:
            mean = sum(self.returns) / len(self.returns) if self.returns else None
            return {"peer": "cleanrl ppo_atari_envpool", "status": status, "sps": self.sps,
                    "frames_per_s": self.sps * self.fps_mult if self.sps is not None else None,
                    "env_steps": self.steps, "frames": self.steps * self.fps_mult, "games": self.games,
                    "return_mean20": mean, "target": self.target,
                    "reached_target_minutes": round(self.reached[0], 2) if self.reached else None,
                    "reached_target_frames": self.reached[1] * self.fps_mult if self.reached else None,
                    "minutes": round((time.monotonic() - self.t0) / 60, 2)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="peer_cleanrl_atari", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, required=True, help="wall-clock budget, start-up included")
    p.add_argument("--script", default=str(DEFAULT_SCRIPT), help="CleanRL's ppo_atari_envpool.py")
    p.add_argument("--log-dir", default="", help="where the script's runs/ folder goes (default: a temp folder)")
    p.add_argument("--target", type=float, default=18.0, help="mean return of 20 games to time (default 18)")
    p.add_argument("--frames-per-step", type=int, default=4, help="frames per agent step (Atari v5: 4)")
    a = p.parse_args(ours)
    t0 = time.monotonic()
    script = Path(a.script).resolve()
    if not script.is_file():
        print(f"peer_cleanrl_atari: CleanRL's script is not at {script}: run scripts/peer_cleanrl_prepare.sh "
              "(it copies it from a CleanRL checkout into .peer/cleanrl/)", file=sys.stderr)
        return 2
    if not any(t == "--env-id" or t.startswith("--env-id=") or t.startswith("--env_id") for t in theirs):
        theirs = ["--env-id", "Pong-v5", *theirs]
    log_dir = Path(a.log_dir or os.environ.get("TMPDIR", "/tmp")).resolve() / f"cleanrl_peer_{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(log_dir)  # the script writes runs/<run name>/ under the working directory
    watch = Watch(sys.stdout, a.frames_per_step, a.target, t0)

    def finish(status: str) -> None:
        sys.stdout = watch.out
        print(json.dumps(watch.result(status)), flush=True)

    def out_of_time() -> None:
        finish("budget")
        os._exit(0)  # the script has no stop hook: its TensorBoard run is left as the last flush wrote it

    timer = threading.Timer(max(0.0, a.seconds - (time.monotonic() - t0)), out_of_time)
    timer.daemon = True
    timer.start()
    install_shim()
    sys.argv = [str(script), *theirs]
    sys.stdout = watch
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            finish("failed")
            return int(e.code) if isinstance(e.code, int) else 1
    timer.cancel()
    finish("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
