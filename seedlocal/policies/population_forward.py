"""Many different networks, one batched forward: the population's parameter rows and the forward over them.

Uber's GPU deep neuroevolution (Such et al. 2017) evaluates a population of *different* networks in one accelerator
call while CPUs step environments. Here a job's member is copied once into its slot's row of
``PopulationForward.slots``, and every step reads the rows in place, a run of consecutive slots as a view (the
README's "Neuroevolution").
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn import functional as F

from seedlocal.networks import MULTI, PolicyNet, as_float, flatten_obs
from seedlocal.normalize import RunningNorm, normalise

MAX_RUNS = 4  # a batch in more runs of consecutive slots than this gathers its rows instead
TRIAL_BATCHES = 5  # batches on which ``auto`` times every strategy before it settles


def _linear(params: torch.Tensor, h: torch.Tensor, w: int, out_f: int, in_f: int, b: int, mulsum: bool) -> torch.Tensor:
    """Rows of ``h`` [n, in] each through its own Linear layer, whose weight sits [in, out] in the slot rows
    ``params`` [n, size] (views: no copy): a batched matmul, or (``mulsum``) a broadcast multiply summed over
    ``in``, which a CPU runs as a few vector loops across rows of contiguous ``out`` vectors where bmm makes one
    tiny GEMM call per row."""
    weight = params[:, w:w + out_f * in_f].view(-1, in_f, out_f)
    if mulsum:
        return torch.mul(weight, h.unsqueeze(2)).sum(1).add(params[:, b:b + out_f])
    return torch.baddbmm(params[:, b:b + out_f].unsqueeze(1), h.unsqueeze(1), weight).squeeze(1)


def _conv(params: torch.Tensor, x: torch.Tensor, w: int, out_c: int, in_c: int, k: int, stride: int,
          b: int) -> torch.Tensor:
    """Images ``x`` [n, C, H, W], each through its own convolution (weight [out, C, k, k] as the module holds it,
    in the slot rows): one grouped convolution, a group per row. On the 2-core machine that ran the Nature torso's
    three layers 1.8x faster than a batched matmul over unfolded patches (32 rows: 10.9 vs 19.1 ms) and MinAtar's
    one layer as fast (0.2 ms); the weights, 2-8% of a row, are copied into the grouped layout."""
    n, _, height, width = x.shape
    weight = params[:, w:w + out_c * in_c * k * k].reshape(n * out_c, in_c, k, k)
    y = F.conv2d(x.reshape(1, n * in_c, height, width), weight, params[:, b:b + out_c].reshape(-1), stride=stride,
                 groups=n)
    return y.view(n, out_c, y.shape[2], y.shape[3])


def _layer_plan(template: nn.Module, offsets: dict[str, int]) -> list | None:
    """The network as plain layers, when ``template`` is a PolicyNet whose torso is a chain of Conv2d (no padding,
    no dilation, one group), Flatten and Linear layers with elementwise activations (the MLP, MinAtar and Nature
    torsos), each layer a list: ["conv", weight offset, out, in, k, stride, bias offset, activation] | ["flatten"] |
    ["linear", weight offset, out, in, bias offset, activation]. Else None (the IMPALA ResNet's residual blocks): those
    networks get vmap and loop only."""
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
    return plan if plan and plan[-1][0] == "linear" else None


class PopulationForward:
    """Per-slot parameter rows and a batched forward over them.

    Strategies (the README's "Neuroevolution"; a network's: ``candidates``): ``bmm`` (plain layers,
    ``_layer_plan``), ``mulsum`` (MLPs), ``vmap``, ``loop``; ``auto`` times them on its first batches (``__call__``).

    Slot rows hold each Linear weight transposed, [in, out]: a row's product is then a vector-matrix product over
    contiguous ``out`` vectors. On the 2-core development machine (P = 256 CartPole MLPs, 12-100% of slots active)
    that made ``bmm`` 1.5-3.7x faster and the best strategy 1.0-2.2x faster than the [out, in] layout.

    With a template that has ``obs_norm``, a row also holds, after the parameters, the observation mean and scale
    its job was submitted with (``stats_of``): every step of a job normalises by one set of statistics, whatever
    the population's shared ones become meanwhile, and the forward reads them from the same views as the weights.
    """

    def __init__(self, template: nn.Module, num_slots: int, device: torch.device | str = "cpu", strategy: str = "auto"):
        self.template = template.to(device)
        names, sizes = zip(*[(name, p.numel()) for name, p in template.named_parameters()])
        *starts, self.size = itertools.accumulate(sizes, initial=0)
        offsets = dict(zip(names, starts))  # where each parameter starts in the flat vector
        self.plan = _layer_plan(template, offsets)
        # What this network can use (the recipe refuses any other). mulsum's broadcast product is [rows, in, out]:
        # fine for an MLP's layers, a copy of every member's weights per step for a torso's 1,024-3,136 features.
        self.candidates = (("vmap", "loop") if self.plan is None else ("bmm", "vmap", "loop")
                           if self.plan[0][0] == "conv" else ("bmm", "mulsum", "vmap"))
        # Slot layout: each Linear weight of a plan stored [in, out] (see the class docstring); ``_perm`` maps slot
        # positions to positions of the flat parameter vector (None: the same layout).
        linear = [op for op in self.plan or () if op[0] == "linear"]
        perm = torch.arange(self.size)
        for _, w, out_f, in_f, _, _ in linear:
            perm[w:w + out_f * in_f] = w + torch.arange(out_f * in_f).view(out_f, in_f).t().reshape(-1)
        self._perm = perm.to(device) if linear else None
        weights = {op[1] for op in linear}
        self.layout = [(name, p.shape, offsets[name], offsets[name] in weights)  # the last: held [in, out]
                       for name, p in template.named_parameters()]
        self.strategy = strategy
        self._trials: dict[str, list[float]] = {c: [] for c in self.candidates}
        norm = getattr(template, "obs_norm", None)
        self.norm_size = 0 if norm is None else norm.mean.numel()
        # Read once: the forward never reads the template's obs_norm, which the learner swaps at each commit.
        self.norm_clip = 0.0 if norm is None else norm.clip
        self.slots = torch.zeros(num_slots, self.size + 2 * self.norm_size, device=device)
        # What the MLP reads (a MULTI torso's vector fields), flat, and what obs_norm normalises.
        self.mlp_keys = list(getattr(getattr(template, "encoder", None), "vector_keys",
                                     getattr(template, "obs_keys", [""])))
        self.obs_classes = getattr(getattr(template, "encoder", None), "classes", {})  # Discrete fields: one-hot

    def to_slots(self, params: torch.Tensor) -> torch.Tensor:
        """Flat parameter vectors [n, size] in the slot layout."""
        return params if self._perm is None else params.index_select(1, self._perm)

    def stats_of(self, norm: RunningNorm) -> torch.Tensor:
        """``norm``'s statistics as a slot row's tail holds them: [mean, scale], what ``norm`` multiplies by."""
        return torch.cat([norm.mean, norm.scale()]).to(self.slots.dtype)

    def load(self, slot_ids: torch.Tensor, params: torch.Tensor, members: torch.Tensor,
             stats: torch.Tensor | None = None) -> None:
        """Slot ``slot_ids[i]`` now plays member ``members[i]`` of ``params``, normalising by ``stats``
        (``stats_of``; default: the template's statistics now): one copy per job."""
        rows = self.to_slots(params.index_select(0, members))
        if self.norm_size:
            if stats is None:
                stats = self.stats_of(self.template.obs_norm)
            rows = torch.cat([rows, stats.expand(len(rows), -1)], 1)
        self.slots.index_copy_(0, slot_ids, rows)

    # -- forward ------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, slot_ids: np.ndarray, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [B, A]: row i from the network in slot ``slot_ids[i]`` (ascending, or one slot on every row)
        on ``obs`` row i."""
        if self.strategy != "auto":
            return self._forward(self.strategy, slot_ids, obs)
        if len(slot_ids) < 8:  # too small to time fairly
            return self._forward(self.candidates[0], slot_ids, obs)
        # A trial batch: every candidate on the same rows (in turn first, so none always gets the warm caches),
        # until each has TRIAL_BATCHES timings.
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
        if len(slot_ids) > 1 and slot_ids[0] == slot_ids[-1]:
            # One network on every row (``PopulationPolicy.serving``, eval): its row broadcast, not gathered. A
            # Nature CNN over 10 rows on one core: 21 ms against 112 ms gathered, the same outputs bit for bit.
            lo = int(slot_ids[0])
            return self._block(strategy, self.slots[lo:lo + 1].expand(len(slot_ids), -1), obs)
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
        """Each row through its own network, layer by layer (``self.plan``), every weight a view of ``params``."""
        if self.plan[0][0] == "conv":
            h = obs[""]
            if getattr(self.template.encoder, "hwc", False):
                h = h.permute(0, 3, 1, 2)  # (N, H, W, C) grids seen as (N, C, H, W), as conv_features does
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
        out = {}
        for name, shape, o, transposed in self.layout:
            row = flat[o:o + shape.numel()]
            out[name] = row.view(shape[::-1]).t() if transposed else row.view(shape)
        return out

    def _one(self, flat: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = {k: v.unsqueeze(0) for k, v in obs.items()}
        tensors = self.unflatten(flat)
        if not self.norm_size:
            return functional_call(self.template, tensors, (x,)).squeeze(0)
        # A PolicyNet's MLP input (only MLPs have obs_norm: the whole torso's, or a MULTI torso's beside its
        # convolutions), normalised by the row's statistics and then through its layers: functional_call would
        # patch the template's obs_norm, which the learner thread reads and swaps.
        o, d = self.size, self.norm_size
        h = normalise(flatten_obs(self.mlp_keys, x, self.obs_classes), flat[o:o + d], flat[o + d:o + 2 * d],
                      self.norm_clip)
        for name in ("encoder", "policy"):
            part = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
            args = (x, h) if name == "encoder" and self.template.kind == MULTI else (h,)
            h = functional_call(getattr(self.template, name), part, args)
        return h.squeeze(0)
