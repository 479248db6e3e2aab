"""Many different networks, one batched forward: population evaluation.

Uber's GPU deep neuroevolution (Such et al. 2017) evaluates a population of
*different* networks in one accelerator call while CPUs step environments.
Here every env slot of the pipeline plays one (member, episode) job at a
time, taken from a work queue when its episode begins; when the queue is
empty the slot idles, and no forward pass is spent on it. A group whose envs
all idle is *held* (its worker sleeps) until more work arrives, and then
restarts on fresh episodes.

Parameters live per env slot: when a job starts on a slot, its member's
flat vector is copied into that slot's row of ``PopulationForward.slots``
once (MLP weights transposed to [in, out] on the way, see
``PopulationForward``), and every step reads the rows in place. A batch's
slots come in runs of consecutive ids (whole groups while the queue is
full), each run a view of the slot rows: no parameter is copied per step.
Only a batch broken into many short runs (a generation's tail) gathers its
few rows.

Jobs are asynchronous (``submit`` returns a ``Job``), so the next population
or an elite's re-evaluation can play beside the episodes still running.

With ``max_episode_steps`` set, a job's episode that reaches that many steps
ends there for its job (truncated): the return so far is scored, the slot is
free. Its env plays on unserved until its episode ends or its group restarts,
as any idle slot's does (the pipeline resets groups, not single envs).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.func import functional_call, vmap

from seedlocal.algos.distributions import Categorical
from seedlocal.networks import MULTI, PolicyNet, as_float, flatten_obs, legal_only
from seedlocal.normalize import RunningNorm, merge_moments, normalise
from seedlocal.pipeline.policy import HOLD, RESTART, SERVE, Policy, Unhold
from seedlocal.spec import MASK_KEY

MAX_RUNS = 4  # a batch in more runs of consecutive slots than this gathers its rows instead
OBS_STATS_EVERY = 4  # with shared observation statistics: every this many batches adds its rows
TRIAL_BATCHES = 5  # batches on which ``auto`` times every strategy before it settles


def _linear(params: torch.Tensor, h: torch.Tensor, w: int, out_f: int, in_f: int, b: int,
            mulsum: bool) -> torch.Tensor:
    """Rows of ``h`` [n, in] each through its own Linear layer, whose weight
    sits [in, out] in the slot rows ``params`` [n, size] (views: no copy):
    a batched matmul, or (``mulsum``) a broadcast multiply summed over
    ``in``, which a CPU runs as a few vector loops across rows of contiguous
    ``out`` vectors where bmm makes one tiny GEMM call per row."""
    weight = params[:, w:w + out_f * in_f].view(-1, in_f, out_f)
    if mulsum:
        return torch.mul(weight, h.unsqueeze(2)).sum(1).add(params[:, b:b + out_f])
    return torch.baddbmm(params[:, b:b + out_f].unsqueeze(1), h.unsqueeze(1), weight).squeeze(1)


def _conv(params: torch.Tensor, x: torch.Tensor, w: int, out_c: int, in_c: int, k: int, stride: int,
          b: int) -> torch.Tensor:
    """Images ``x`` [n, C, H, W], each through its own convolution (weight
    [out, C, k, k] as the module holds it, in the slot rows): one grouped
    convolution, a group per row. On the 2-core machine that ran the Nature
    torso's three layers 1.8x faster than a batched matmul over unfolded
    patches (32 rows: 10.9 vs 19.1 ms) and MinAtar's one layer as fast (0.2
    ms); the weights, 2-8% of a row, are copied into the grouped layout."""
    n, _, height, width = x.shape
    weight = params[:, w:w + out_c * in_c * k * k].reshape(n * out_c, in_c, k, k)
    y = F.conv2d(x.reshape(1, n * in_c, height, width), weight, params[:, b:b + out_c].reshape(-1), stride=stride,
                 groups=n)
    return y.view(n, out_c, y.shape[2], y.shape[3])


def _layer_plan(template: nn.Module, offsets: dict[str, int]) -> list | None:
    """The network as plain layers, when ``template`` is a PolicyNet whose
    torso is a chain of Conv2d (no padding, no dilation, one group), Flatten
    and Linear layers with elementwise activations (the MLP, MinAtar and
    Nature torsos): [("conv", weight offset, out, in, k, stride, bias
    offset, activation) | ("flatten",) | ("linear", weight offset, out, in,
    bias offset, activation)]. Else None (the IMPALA ResNet's residual
    blocks): those networks get vmap and loop only."""
    if not isinstance(template, PolicyNet) or template.kind == MULTI:  # a MULTI torso is no chain of layers
        return None
    leaves = [(n, m) for n, m in template.encoder.named_modules()
              if not any(True for _ in m.children()) and not isinstance(m, (nn.Sequential, nn.Identity))]
    plan = []
    for name, m in leaves + [("", template.policy)]:
        key = "policy" if m is template.policy else "encoder." + name
        if isinstance(m, nn.Linear) and (not plan or plan[-1][0] != "conv"):
            plan.append(["linear", offsets[key + ".weight"], m.out_features, m.in_features, offsets[key + ".bias"],
                         None])
        elif (isinstance(m, nn.Conv2d) and m.bias is not None and m.groups == 1 and m.padding == (0, 0)
              and m.dilation == (1, 1) and m.kernel_size[0] == m.kernel_size[1] and m.stride[0] == m.stride[1]
              and (not plan or plan[-1][0] == "conv")):
            plan.append(["conv", offsets[key + ".weight"], m.out_channels, m.in_channels, m.kernel_size[0],
                         m.stride[0], offsets[key + ".bias"], None])
        elif isinstance(m, nn.Flatten) and plan and plan[-1][0] == "conv":
            plan.append(["flatten"])
        elif isinstance(m, (nn.Tanh, nn.ReLU)) and plan and plan[-1][0] != "flatten" and plan[-1][-1] is None:
            plan[-1][-1] = m
        else:
            return None
    if not plan or plan[-1][0] != "linear":
        return None
    return [tuple(p) for p in plan]


def strategies(template: nn.Module, plan: list | None = None) -> tuple[str, ...]:
    """The population forward strategies a network can use (see ``PopulationForward``)."""
    if plan is None:
        plan = _layer_plan(template, _offsets(template))
    if plan is None:
        return ("vmap", "loop")
    # mulsum's broadcast product is [rows, in, out]: fine for an MLP's layers, a
    # copy of every member's weights per step for a torso's 1,024-3,136 features.
    return ("bmm", "vmap", "loop") if plan[0][0] == "conv" else ("bmm", "mulsum", "vmap")


def _offsets(template: nn.Module) -> dict[str, int]:
    """Where each parameter starts in the network's flat vector."""
    offsets, o = {}, 0
    for name, p in template.named_parameters():
        offsets[name] = o
        o += p.numel()
    return offsets


class PopulationForward:
    """Per-slot parameter rows and a batched forward over them.

    Strategies (``auto`` runs every candidate on each of its first few
    batches and keeps the one with the lowest median time): for networks of
    plain layers (MLPs, the MinAtar and Nature torsos, see ``_layer_plan``)
    ``bmm`` (batched matmuls straight from the slot rows; a convolution as
    one grouped convolution, a group per row); for MLPs also ``mulsum`` (the
    Linear products as a broadcast multiply and a sum); ``vmap`` over
    ``functional_call`` (convolutions become grouped convolutions); ``loop``,
    one call per row on views, for networks bmm cannot take.
    ``scripts/bench_population.py`` times them all.

    Slot rows hold each Linear weight transposed, [in, out]: a row's product is
    then a vector-matrix product over contiguous ``out`` vectors. On the
    2-core development machine (P = 256 CartPole MLPs, 12-100% of slots
    active) that made ``bmm`` 1.5-3.7x faster and the best strategy
    1.0-2.2x faster than the [out, in] layout.

    With a template that has ``obs_norm``, a row also holds, after the
    parameters, the observation mean and scale its job was submitted with
    (``stats_of``): every step of a job normalises by one set of statistics,
    whatever the population's shared ones become meanwhile, and the forward
    reads them from the same views as the weights.
    """

    def __init__(self, template: nn.Module, num_slots: int, device: torch.device | str = "cpu",
                 strategy: str = "auto"):
        device = torch.device(device)
        self.template = template.to(device)
        self.layout = [(name, p.shape, p.numel()) for name, p in template.named_parameters()]
        offsets = _offsets(template)
        self.size = sum(n for _, _, n in self.layout)
        self.plan = _layer_plan(template, offsets)
        self.candidates = strategies(template, self.plan)
        if strategy not in ("auto",) + self.candidates:
            raise ValueError(f"strategy={strategy!r}: expected auto or one of {', '.join(self.candidates)} "
                             f"for this network")
        # Slot layout: each Linear weight stored [in, out] (see the class docstring);
        # ``_perm`` maps slot positions to positions of the flat parameter vector.
        self._transposed: set[str] = set()
        self._perm = None
        if self.plan is not None:
            perm = torch.arange(self.size)
            linear = [op for op in self.plan if op[0] == "linear"]
            for _, w, out_f, in_f, _, _ in linear:
                perm[w:w + out_f * in_f] = w + torch.arange(out_f * in_f).view(out_f, in_f).t().reshape(-1)
            self._perm = perm.to(device)
            self._transposed = {name for name, shape, _ in self.layout
                                if offsets[name] in {op[1] for op in linear} and len(shape) == 2}
        self.strategy = strategy
        self._trials: dict[str, list[float]] = {c: [] for c in self.candidates}
        norm = getattr(template, "obs_norm", None)
        self.norm_size = 0 if norm is None else norm.mean.numel()
        # Read once: the forward never reads the template's obs_norm, which the learner swaps at each commit.
        self.norm_clip = 0.0 if norm is None else norm.clip
        self.slots = torch.zeros(num_slots, self.size + 2 * self.norm_size, device=device)
        self.obs_keys = list(getattr(template, "obs_keys", [""]))
        # What the MLP reads (a MULTI torso's vector fields), flat, and what obs_norm normalises.
        self.mlp_keys = list(getattr(getattr(template, "encoder", None), "vector_keys", self.obs_keys))
        self.obs_classes = getattr(getattr(template, "encoder", None), "classes", None)  # Discrete fields: one-hot

    def to_slots(self, params: torch.Tensor) -> torch.Tensor:
        """Flat parameter vectors [n, size] in the slot layout."""
        return params if self._perm is None else params.index_select(1, self._perm)

    def stats_of(self, norm: RunningNorm) -> torch.Tensor:
        """``norm``'s statistics as a slot row's tail holds them: [mean, scale], float32
        (the values ``norm`` itself multiplies by: the same outputs, bit for bit)."""
        return torch.cat([norm.mean, norm.scale()]).to(self.slots.dtype)

    def load(self, slot_ids: torch.Tensor, params: torch.Tensor, members: torch.Tensor,
             stats: torch.Tensor | None = None) -> None:
        """Slot ``slot_ids[i]`` now plays member ``members[i]`` of ``params``,
        normalising by ``stats`` (``stats_of``; default: the template's
        statistics now): one copy per job."""
        rows = self.to_slots(params.index_select(0, members))
        if self.norm_size:
            if stats is None:
                stats = self.stats_of(self.template.obs_norm)
            rows = torch.cat([rows, stats.expand(len(rows), -1)], 1)
        self.slots.index_copy_(0, slot_ids, rows)

    # -- forward ------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, slot_ids: np.ndarray, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [B, A]: row i from the network in slot ``slot_ids[i]`` (ascending)
        on ``obs`` row i."""
        if self.strategy != "auto":
            return self._forward(self.strategy, slot_ids, obs)
        if len(slot_ids) < 8:  # too small to time fairly
            return self._forward(self.candidates[0], slot_ids, obs)
        # A trial batch: every candidate on the same rows (in turn first, so
        # none always gets the warm caches), until each has TRIAL_BATCHES timings.
        k = len(self._trials[self.candidates[0]])
        order = self.candidates[k % len(self.candidates):] + self.candidates[:k % len(self.candidates)]
        for c in order:
            t0 = time.perf_counter()
            out = self._forward(c, slot_ids, obs)
            if out.device.type == "cuda":
                torch.cuda.current_stream(out.device).synchronize()  # this stream only, not the learner's
            self._trials[c].append(time.perf_counter() - t0)
        if k + 1 >= TRIAL_BATCHES:
            self.strategy = min(self._trials, key=lambda c: float(np.median(self._trials[c])))
        return out

    def _forward(self, strategy: str, slot_ids: np.ndarray, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        breaks = np.flatnonzero(np.diff(slot_ids) != 1) + 1
        if len(breaks) >= MAX_RUNS:
            # Many short runs (a generation's tail): one call on gathered rows.
            idx = torch.from_numpy(slot_ids).to(self.slots.device)
            return self._block(strategy, self.slots.index_select(0, idx), obs)
        outs, starts = [], [0, *breaks.tolist()]
        for a, b in zip(starts, starts[1:] + [len(slot_ids)]):
            lo = int(slot_ids[a])
            block = self.slots[lo:lo + (b - a)]  # a view: the run's rows in place
            outs.append(self._block(strategy, block, {k: v[a:b] for k, v in obs.items()}))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _block(self, strategy: str, params: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if strategy in ("bmm", "mulsum"):
            return self._plan_forward(params, obs, strategy == "mulsum")
        if strategy == "vmap":
            return vmap(self._one)(params, obs)
        return torch.stack([self._one(params[i], {k: v[i] for k, v in obs.items()}) for i in range(len(params))])

    def _plan_forward(self, params: torch.Tensor, obs: dict[str, torch.Tensor], mulsum: bool) -> torch.Tensor:
        """Each row through its own network, layer by layer (``self.plan``),
        every weight a view of the slot rows ``params``."""
        if self.plan[0][0] == "conv":
            h = obs[""]
            if getattr(self.template.encoder, "hwc", False):
                h = h.permute(0, 3, 1, 2)  # (N, H, W, C) grids seen as (N, C, H, W), as encode_obs does
            h = as_float(h)
        else:
            h = flatten_obs(self.mlp_keys, obs, self.obs_classes)  # [n, in]
            if self.norm_size:  # each row by its job's statistics (the rows' tail)
                o, d = self.size, self.norm_size
                h = normalise(h, params[:, o:o + d], params[:, o + d:o + 2 * d], self.norm_clip)
        for op in self.plan:
            if op[0] == "conv":
                h = _conv(params, h, *op[1:7])
            elif op[0] == "flatten":
                h = h.reshape(h.shape[0], -1)
            else:
                h = _linear(params, h, *op[1:5], mulsum)
            if op[-1] is not None and op[0] != "flatten":
                h = op[-1](h)
        return h

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """One slot row as the template's parameters (views)."""
        out, o = {}, 0
        for name, shape, n in self.layout:
            out[name] = flat[o:o + n].view(shape[1], shape[0]).t() if name in self._transposed \
                else flat[o:o + n].view(shape)
            o += n
        return out

    def _one(self, flat: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = {k: v.unsqueeze(0) for k, v in obs.items()}
        tensors = self.unflatten(flat)
        if not self.norm_size:
            return functional_call(self.template, tensors, (x,)).squeeze(0)
        # A PolicyNet's MLP input (only MLPs have obs_norm: the whole torso's,
        # or a MULTI torso's beside its convolutions), normalised by the row's
        # statistics and then through its layers: functional_call would patch
        # the template's obs_norm, which the learner thread reads and swaps.
        o, d = self.size, self.norm_size
        h = normalise(flatten_obs(self.mlp_keys, x, self.obs_classes), flat[o:o + d], flat[o + d:o + 2 * d],
                      self.norm_clip)
        for name in ("encoder", "policy"):
            part = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
            args = (x, h) if name == "encoder" and self.template.kind == MULTI else (h,)
            h = functional_call(getattr(self.template, name), part, args)
        return h.squeeze(0)


def member_actions(out: torch.Tensor, continuous: bool, greedy: bool, action_noise: float = 0.0,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """The population's action rule, one member's network output -> its action: over a Box the output itself
    (the env maps it onto its bounds), plus Gaussian noise of std ``action_noise`` if set; over Discrete actions
    the argmax of the logits (``greedy``, the deep-GA convention) or a sample from their softmax."""
    if continuous:
        return out if not action_noise else out + action_noise * torch.randn_like(out)
    if greedy:
        return out.argmax(-1)
    return Categorical.sample(out, generator)


class MemberPolicy(Policy):
    """One network acting alone by the population's rule (``member_actions``): seedlocal eval's policy for a
    neuroevolution checkpoint, whose best member's vector fills ``net`` (with the population's observation
    statistics where it has them). No action noise: eval plays the policy itself."""

    def __init__(self, net: PolicyNet, spec, greedy: bool):
        self.net, self.spec, self.greedy = net, spec, greedy
        self.device = next(net.parameters()).device
        self.acting = "its output" if net.continuous else "argmax" if greedy else "sampled"

    @torch.inference_mode()
    def act(self, obs, core=None, env_ids=None, first=None):
        return member_actions(self.net(obs), self.net.continuous, self.greedy, generator=self.generator), {}, None


class Job:
    """The episodes of one population: ``returns[m]`` (raw) and ``fitness[m]``
    (what selection sees: the return less ``reward_shift`` per step, see
    ``PopulationPolicy``) fill as member m's episodes end. ``stats``: the
    observation statistics every episode of the job is normalised by (None:
    the network has no ``obs_norm``)."""

    def __init__(self, params: torch.Tensor, episodes: int, stats: torch.Tensor | None = None):
        self.params, self.stats = params, stats
        # On CUDA the inference thread reads ``params`` and ``stats`` on its own
        # stream: it waits for this event, recorded after the kernels that made them.
        self.made = None
        if params.is_cuda:
            self.made = torch.cuda.Event()
            self.made.record(torch.cuda.current_stream(params.device))
        self.episodes = episodes
        self.returns: list[list[float]] = [[] for _ in range(params.shape[0])]
        self.fitness: list[list[float]] = [[] for _ in range(params.shape[0])]
        self.pending = params.shape[0] * episodes
        self.done = threading.Event()
        if not self.pending:
            self.done.set()

    def wait(self, check=None) -> list[list[float]]:
        """Block until every episode has a return; ``check`` runs every 0.5 s
        (it raises if the pipeline died)."""
        while not self.done.wait(0.5):
            if check is not None:
                check()
        return self.returns

    @property
    def members(self) -> int:
        return len(self.returns)

    def members_done(self) -> int:
        """Members whose every episode has a return (read from any thread:
        the lists only grow)."""
        return sum(len(r) >= self.episodes for r in self.returns)


class PopulationPolicy(Policy):
    """The inference loop's policy during neuroevolution (see module docstring).

    ``submit``/``evaluate`` (learner thread) post jobs; ``plan``/``act``
    (inference thread) run them.
    """

    plans = True

    def __init__(self, template: nn.Module, envs_per_group: int, num_groups: int, device: torch.device,
                 greedy: bool = True, strategy: str = "auto", action_noise: float = 0.0, reward_shift: float = 0.0,
                 max_episode_steps: int = 0):
        """Box actions: the network's output is the action (mapped onto the
        env's bounds, ``envs/bounds.py``), plus Gaussian noise of std ``action_noise`` if set (Salimans et
        al.'s MuJoCo runs). ``reward_shift`` is taken from every step's
        reward in the fitness (not in the returns reported): ARS's removal of
        the survival bonus on Hopper, Walker2d, Ant and Humanoid. With a
        template that has ``obs_norm``, the population shares observation
        statistics, gathered from every ``OBS_STATS_EVERY``-th batch's rows
        and taken into use by ``commit_obs_stats`` between generations; a
        job normalises by the statistics committed when it was submitted.
        ``max_episode_steps`` (0: none) ends a job's episode at that many
        steps, scored on its return so far (see the module docstring)."""
        self.E, self.device, self.greedy = envs_per_group, device, greedy
        self.continuous = bool(getattr(template, "continuous", False))
        self.action_noise, self.reward_shift = action_noise, reward_shift
        self.max_episode_steps = max_episode_steps
        n = envs_per_group * num_groups
        self.forward = PopulationForward(template, n, device, strategy)
        # Observations since the last commit: made, written and (through
        # ``_seen_written``, a CUDA event) handed over by the inference thread.
        self._seen: RunningNorm | None = None
        self._seen_written = None
        self._stats_lock = threading.Lock()
        self._batches = 0
        # Data-parallel ranks (split populations): pools every rank's observations into each commit (``Ranks.
        # pool_moments``), so that every rank's jobs normalise by the same statistics; None for one process.
        self.pool_stats: Callable | None = None
        self.assign = np.full(n, -1, np.int64)  # member per env slot; -1 idle
        self.steps = np.zeros(n, np.int64)  # steps each slot's job episode has played (0 idle), for progress
        self._env_job: list[Job | None] = [None] * n
        self._lock = threading.Lock()
        self._queue: deque[tuple[Job, int]] = deque()
        self._spare: deque[tuple[Job, int]] = deque()  # taken only when _queue is empty
        self.forward_s = 0.0
        self.forward_envs = 0
        self.episodes_scored = 0  # evaluation episodes that ended (idle slots' episodes are not counted)
        self.episodes_capped = 0  # of those, ended by max_episode_steps
        # Wakes the groups ``plan`` held when work arrives; the loop serving
        # this policy connects to it (the policy never holds the loop).
        self.unhold = Unhold()

    # -- learner thread ---------------------------------------------------------

    def submit(self, params: torch.Tensor, episodes: int, front: bool = False, spare: bool = False) -> Job:
        """Queue ``episodes`` episodes of every member (row of ``params``);
        ``front`` puts them before the jobs already waiting; ``spare`` jobs
        start only on slots the other jobs leave free (a generation's tail),
        so work nobody waits for yet never delays a population."""
        norm = self.forward.template.obs_norm if self.forward.norm_size else None
        # A copy of the statistics committed now: a commit while the job plays
        # does not reach its episodes (an ARS pair is scored under one
        # normalisation). On CUDA it is made on this (the learner's) stream
        # after the commit's writes and before ``Job.made`` is recorded, so the
        # inference stream, which waits for that event, reads it whole, as the
        # parameters; the forward reads no other copy of the statistics.
        job = Job(params.to(self.device), episodes, None if norm is None else self.forward.stats_of(norm))
        # Interleave members so every one gets its first episode early.
        entries = [(job, m) for _ in range(episodes) for m in range(params.shape[0])]
        with self._lock:
            queue = self._spare if spare else self._queue
            if front:
                queue.extendleft(reversed(entries))
            else:
                queue.extend(entries)
        self.unhold()
        return job

    def longest_running(self) -> int:
        """Steps of the longest job episode still playing (0: none): what a
        generation waits for at its end."""
        return int(self.steps.max(initial=0))

    def evaluate(self, params: torch.Tensor, episodes: int, check=None) -> list[list[float]]:
        """Returns, per member (row of ``params``), the returns of ``episodes`` episodes."""
        return self.submit(params, episodes).wait(check)

    def commit_obs_stats(self) -> None:
        """Take the observations gathered since the last commit into the
        statistics that jobs submitted from now on normalise by (a new module
        swapped in whole: the one a checkpoint or a submission holds is never
        written again). Jobs already submitted keep theirs."""
        with self._stats_lock:
            seen, written = self._seen, self._seen_written
            self._seen = self._seen_written = None
        if seen is not None and written is not None:
            # The inference stream wrote ``seen``; this (the learner's) stream
            # reads it only after that write, and the allocator reuses its
            # memory only after these reads.
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(written)
            for t in seen.buffers():
                t.record_stream(stream)
        if self.pool_stats is not None and self.forward.norm_size:
            seen = self._pooled(seen)  # on every rank at every commit, with or without rows of its own
        if seen is None or float(seen.count) == 0:
            return
        current = self.forward.template.obs_norm
        merged = RunningNorm(current.mean.numel(), current.clip, current.eps).to(self.device)
        merged.load_state_dict(current.state_dict())
        if float(current.count) == 0:
            merged.load_state_dict(seen.state_dict())
        else:
            count, mean, var = merge_moments(float(current.count), current.mean, current.var, float(seen.count),
                                             seen.mean, seen.var)
            merged.count.fill_(count)
            merged.mean.copy_(mean)
            merged.var.copy_(var)
        self.forward.template.obs_norm = merged

    def _pooled(self, seen: RunningNorm | None) -> RunningNorm | None:
        """Every rank's observations since the last commit (``pool_stats``), merged in rank order."""
        size = self.forward.norm_size
        if seen is None:
            n, mean, var = 0.0, torch.zeros(size, dtype=torch.float64), torch.ones(size, dtype=torch.float64)
        else:
            n, mean, var = float(seen.count), seen.mean.cpu(), seen.var.cpu()
        n, mean, var = self.pool_stats(n, mean, var)
        if not n:
            return None
        pooled = RunningNorm(size).to(self.device)
        pooled.count.fill_(n)
        pooled.mean.copy_(mean)
        pooled.var.copy_(var)
        return pooled

    # -- inference thread -------------------------------------------------------

    def plan(self, groups: np.ndarray, first: np.ndarray, done: np.ndarray, ep_return: np.ndarray,
             ep_length: np.ndarray | None = None) -> np.ndarray:
        codes = np.full(len(groups), SERVE, np.int8)
        loads: dict[Job, tuple[list[int], list[int]]] = {}
        with self._lock:
            for i, g in enumerate(groups.tolist()):
                lo = g * self.E
                a = self.assign[lo:lo + self.E]
                length = ep_length[i] if ep_length is not None else np.zeros(self.E, np.int64)
                ended = done[i] & (a >= 0)
                if self.max_episode_steps:
                    capped = (a >= 0) & ~done[i] & (length >= self.max_episode_steps)
                    self.episodes_capped += int(capped.sum())
                    ended |= capped
                for j in np.flatnonzero(ended).tolist():
                    job = self._env_job[lo + j]
                    ret = float(ep_return[i, j])  # a capped episode's return so far
                    job.returns[a[j]].append(ret)
                    job.fitness[a[j]].append(ret - self.reward_shift * float(length[j]))
                    self.episodes_scored += 1
                    job.pending -= 1
                    if job.pending == 0:
                        job.done.set()
                    self._env_job[lo + j] = None
                    a[j] = -1
                # Before new jobs start: a slot taking one now has played nothing of it yet.
                self.steps[lo:lo + self.E] = np.where(a >= 0, length, 0)
                for j in np.flatnonzero(first[i] & (a < 0)).tolist():
                    queue = self._queue or self._spare
                    if not queue:
                        break
                    job, m = queue.popleft()
                    a[j] = m
                    self._env_job[lo + j] = job
                    envs, members = loads.setdefault(job, ([], []))
                    envs.append(lo + j)
                    members.append(m)
                if (a < 0).all():
                    # Idle group: restart it on fresh episodes if work waits
                    # (its envs are mid-episode), else let its worker sleep.
                    codes[i] = RESTART if self._queue or self._spare else HOLD
        for job, (envs, members) in loads.items():
            if job.made is not None:
                stream = torch.cuda.current_stream(job.params.device)
                stream.wait_event(job.made)
                job.params.record_stream(stream)  # not reused by the allocator before this stream is done
                if job.stats is not None:
                    job.stats.record_stream(stream)
            self.forward.load(torch.tensor(envs, device=self.device), job.params,
                              torch.tensor(members, device=self.device), job.stats)
        return codes

    def act(self, obs, core=None, env_ids=None, first=None):
        envs = env_ids if env_ids is not None else np.arange(next(iter(obs.values())).shape[0])
        active = np.flatnonzero(self.assign[envs] >= 0)
        width = (self.forward.template.policy.out_features,) if self.continuous else ()
        actions = torch.zeros((len(envs),) + width, dtype=torch.float32 if self.continuous else torch.long,
                              device=self.device)
        if MASK_KEY in obs:  # envs without a job step too (their steps are not scored): a legal action each
            actions = obs[MASK_KEY].to(torch.uint8).argmax(-1)
        if len(active):
            t0 = time.perf_counter()
            if len(active) < len(envs):
                idx = torch.from_numpy(active).to(self.device)
                obs = {k: v[idx] for k, v in obs.items()}
            self._batches += 1
            if self.forward.norm_size and self._batches % OBS_STATS_EVERY == 0:
                with self._stats_lock:
                    if self._seen is None:  # made here, on this thread's stream, as its updates are
                        self._seen = RunningNorm(self.forward.norm_size).to(self.device)
                        self._seen_written = torch.cuda.Event() if self._seen.count.is_cuda else None
                    self._seen.update(flatten_obs(self.forward.mlp_keys, obs, self.forward.obs_classes))
                    if self._seen_written is not None:  # what commit_obs_stats waits for before it reads
                        self._seen_written.record(torch.cuda.current_stream(self.device))
            # legal_only: the plan's and the statistics' forwards write the layers out, not PolicyNet.forward.
            out = legal_only(self.forward(envs[active], obs), obs)
            chosen = member_actions(out, self.continuous, self.greedy, self.action_noise)
            if len(active) < len(envs):
                actions[idx] = chosen
            else:
                actions = chosen
            self.forward_s += time.perf_counter() - t0
            self.forward_envs += len(active)
        return actions, {}, None
