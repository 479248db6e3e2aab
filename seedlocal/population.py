"""Many different networks, one batched forward: population evaluation.

Uber's GPU deep neuroevolution (Such et al. 2017) evaluates a population of
*different* networks in one accelerator call while CPUs step environments.
Here every env slot of the pipeline plays one (member, episode) job at a
time, taken from a work queue when its episode begins; when the queue is
empty the slot idles, and no forward pass is spent on it. A group whose envs
all idle is *held* (its worker sleeps) until the next evaluation, which
restarts it on fresh episodes.

The batched forward is ``torch.func.vmap`` over ``functional_call``: each
active env brings its member's flat parameter vector (convolutions become
grouped convolutions, linears batched matmuls under vmap).
``scripts/bench_population.py`` measures it against a Python loop over
members and against computing every slot and masking the idle ones.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import torch
from torch.func import functional_call, vmap

from seedlocal.pipeline.inference import HOLD, RESTART, SERVE


class PopulationForward:
    """Runs a template network with per-sample parameters from flat vectors.

    Two ways, chosen by measurement (``strategy="auto"``: both are timed on
    the first batch of at least 8 samples and the faster is kept):
    ``vmap`` makes one batched call but copies every sample's parameters into
    a contiguous block first; ``loop`` runs one call per sample on views.
    Measured on 2 CPU cores: MLPs, vmap 30x faster than the loop at P=256;
    Nature CNNs, the loop 5x faster at P=32 (the 1.7M-parameter copy per
    sample and CPU grouped convolutions dominate). On a GPU the copy is cheap.
    """

    def __init__(self, template: torch.nn.Module, strategy: str = "auto"):
        if strategy not in ("auto", "vmap", "loop"):
            raise ValueError(f"strategy={strategy!r}: expected auto, vmap or loop")
        self.template = template
        self.layout = [(name, p.shape, p.numel()) for name, p in template.named_parameters()]
        self.size = sum(n for _, _, n in self.layout)
        self.strategy = strategy

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, o = {}, 0
        for name, shape, n in self.layout:
            out[name] = flat[o:o + n].view(shape)
            o += n
        return out

    def _one(self, flat: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = {k: v.unsqueeze(0) for k, v in obs.items()}
        return functional_call(self.template, self.unflatten(flat), (x,)).squeeze(0)

    @torch.inference_mode()
    def __call__(self, params: torch.Tensor, obs: dict[str, torch.Tensor], rows: torch.Tensor | None = None):
        """Logits [B, A] where row i comes from network ``params[rows[i]]`` on
        ``obs[i]`` (``rows`` defaults to 0..B-1)."""
        if rows is None:
            rows = torch.arange(params.shape[0], device=params.device)
        if self.strategy == "auto" and len(rows) >= 8:
            self.strategy = self._measure(params, obs, rows)
        if self.strategy == "loop":
            return self.loop(params, obs, rows)
        return vmap(self._one)(params[rows], obs)

    def loop(self, params: torch.Tensor, obs: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        outs = [self._one(params[r], {k: v[i] for k, v in obs.items()}) for i, r in enumerate(rows.tolist())]
        return torch.stack(outs)

    def _measure(self, params, obs, rows) -> str:
        timings = {}
        for name, fn in (("vmap", lambda: vmap(self._one)(params[rows], obs)),
                         ("loop", lambda: self.loop(params, obs, rows))):
            fn()  # warm-up
            if params.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if params.device.type == "cuda":
                torch.cuda.synchronize()
            timings[name] = time.perf_counter() - t0
        return min(timings, key=timings.get)


class PopulationPolicy:
    """The inference loop's policy during neuroevolution (see module docstring).

    ``evaluate`` (learner thread) posts jobs and blocks until every episode
    has a return; ``plan``/``act`` (inference thread) run them.
    """

    outputs: dict = {}
    core_state = None

    def __init__(self, template: torch.nn.Module, envs_per_group: int, num_groups: int, device: torch.device,
                 greedy: bool = True):
        self.forward = PopulationForward(template.to(device))
        self.E, self.device, self.greedy = envs_per_group, device, greedy
        self.assign = np.full(envs_per_group * num_groups, -1, np.int64)  # member per env; -1 idle
        self._lock = threading.Lock()
        self._jobs: deque[int] = deque()
        self._results: list[list[float]] = []
        self._pending = 0
        self._done = threading.Event()
        self.params: torch.Tensor | None = None
        self.forward_s = 0.0
        self.forward_envs = 0
        self.loop = None  # set by the caller once the pipeline exists

    # -- learner thread ---------------------------------------------------------

    def evaluate(self, params: torch.Tensor, episodes: int, check=None) -> list[list[float]]:
        """Returns, per member (row of ``params``), the returns of ``episodes`` episodes."""
        with self._lock:
            self.params = params.to(self.device)
            # Interleave members so every one gets its first episode early.
            self._jobs = deque(m for _ in range(episodes) for m in range(params.shape[0]))
            self._results = [[] for _ in range(params.shape[0])]
            self._pending = params.shape[0] * episodes
            self._done.clear()
        self.loop.unhold()
        while not self._done.wait(0.5):
            if check is not None:
                check()
        return self._results

    # -- inference thread -------------------------------------------------------

    def plan(self, groups: np.ndarray, first: np.ndarray, done: np.ndarray, ep_return: np.ndarray) -> np.ndarray:
        codes = np.full(len(groups), SERVE, np.int8)
        with self._lock:
            for i, g in enumerate(groups.tolist()):
                envs = np.arange(g * self.E, (g + 1) * self.E)
                a = self.assign[envs]
                for j in np.flatnonzero(done[i] & (a >= 0)):
                    self._results[a[j]].append(float(ep_return[i, j]))
                    self._pending -= 1
                    self.assign[envs[j]] = -1
                for j in np.flatnonzero(first[i] & (self.assign[envs] < 0)):
                    if not self._jobs:
                        break
                    self.assign[envs[j]] = self._jobs.popleft()
                if (self.assign[envs] < 0).all():
                    # Idle group: restart it on fresh episodes if work waits
                    # (its envs are mid-episode), else let its worker sleep.
                    codes[i] = RESTART if self._jobs else HOLD
            if self._pending == 0 and self._results:
                self._done.set()
        return codes

    def act(self, obs: dict[str, torch.Tensor], core=None, groups: np.ndarray = None):
        envs = (groups[:, None] * self.E + np.arange(self.E)).ravel()
        members = self.assign[envs]
        active = np.flatnonzero(members >= 0)
        actions = torch.zeros(len(envs), dtype=torch.long, device=self.device)
        if len(active):
            t0 = time.perf_counter()
            idx = torch.from_numpy(active).to(self.device)
            rows = torch.from_numpy(members[active]).to(self.device)
            logits = self.forward(self.params, {k: v[idx] for k, v in obs.items()}, rows)
            if self.greedy:
                chosen = logits.argmax(-1)
            else:
                chosen = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
            actions[idx] = chosen
            self.forward_s += time.perf_counter() - t0
            self.forward_envs += len(active)
        return actions, {}, None
