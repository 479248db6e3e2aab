"""Frames stacked beside the network instead of by the env.

An Atari env that stacks its own frames sends each 84 x 84 frame four times over (once in each of four consecutive
observations): four times the bytes through the workers' shared memory, the inference loop's gather and the learner's
batches. With ``--env.frame-stack 1`` and ``frame_stack 4`` the env sends single frames and the stack is rebuilt here,
on the device, where the network reads it. Both sides build the same stacks as envpool's own: frames t-3 .. t, oldest
first, an episode's first frame repeated before its start: ``FrameHistory`` for acting, ``UnrollStacks`` for V-trace's
learner (docs/pipeline.md).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from seedlocal.dtypes import torch_dtype
from seedlocal.networks import image_layout
from seedlocal.normalize import occurrence


def net_spec(spec, frame_stack: int):
    """The spec the network sees: image observations stacked ``frame_stack`` deep."""
    single = spec.obs.get("")
    if frame_stack <= 1 or single is None:
        return spec
    shape = (frame_stack * single.shape[0],) + single.shape[1:]
    return dataclasses.replace(spec, obs={"": dataclasses.replace(single, shape=shape)})


def stack_problem(spec, frame_stack: int) -> str | None:
    """Why ``frame_stack`` cannot stack this env's observations (None: it can, or it is off)."""
    if frame_stack < 0:
        return "must be >= 0"
    single = spec.obs.get("")
    if frame_stack > 1 and (single is None or image_layout(single) != "chw" or single.shape[0] != 1):
        seen = tuple(single.shape) if single is not None else dict(spec.obs)
        return ("stacks single-channel (1, H, W) image frames, as envpool's Atari sends with --env.frame-stack 1; "
                f"{spec.env_id} observes {seen}")
    return None


def stacking(spec, frame_stack: int) -> int:
    """The depth a policy and learner stack to: ``frame_stack`` for single-channel frames, else 1 (nothing to
    do: no frames, or frames the env stacked itself, which a training run's validation has refused already)."""
    return frame_stack if frame_stack > 1 and stack_problem(spec, frame_stack) is None else 1


def fit_frames(preset, spec, as_preset_sends):
    """A run config (``preset``) fitted to an env's frames: itself, or where its env settings do not fit the env
    (``as_preset_sends()``, the env described with them, raises: envpool's --env.frame-stack on a Gymnasium env) the
    preset with the env's own frames (``spec``), stacked beside the network only where they are single-channel."""
    stack = getattr(preset, "frame_stack", 0)
    with contextlib.suppress(Exception):
        if stack_problem(as_preset_sends(), stack) is None:
            return preset
    kept = {"frame_stack": stack if stack_problem(spec, stack) is None else 0} if hasattr(preset, "frame_stack") else {}
    return dataclasses.replace(preset, env=dataclasses.replace(preset.env, frame_stack=0), **kept)


class FrameHistory:
    """Each env slot's last ``stack`` frames (of ``frame``, a (1, H, W) ``TensorSpec``) on ``device``, grown to
    the slots it is asked about (eval learns its count from its first batch)."""

    def __init__(self, frame, stack: int, device, slots: int = 0):
        self.stack = stack
        # [env slots, stack, H, W] in the frames' own dtype: a bool grid stored as uint8 would be scaled by 1/255.
        self.hist = torch.zeros((slots, stack) + tuple(frame.shape[1:]), dtype=torch_dtype(frame.dtype), device=device)

    def __call__(self, frames: torch.Tensor, ids: torch.Tensor, first: torch.Tensor, slots: int) -> torch.Tensor:
        """[n, 1, H, W] new frames of env slots ``ids`` -> [n, stack, H, W], an episode's first frame repeated
        at its start. ``slots``: one more than the largest of ``ids``, from the host (reading it from ``ids``
        on a GPU would wait for the device every batch)."""
        if len(self.hist) < slots:
            grown = self.hist.new_zeros((slots,) + self.hist.shape[1:])
            grown[:len(self.hist)] = self.hist
            self.hist = grown
        rolled = torch.cat([self.hist[ids][:, 1:], frames], dim=1)
        fresh = frames.expand(-1, self.stack, -1, -1)
        out = torch.where(first.view(-1, 1, 1, 1), fresh, rolled)
        self.hist[ids] = out
        return out


class UnrollStacks:
    """The learner's stacks for unrolls of ``L`` rows whose last row is the next unroll's first (V-trace's
    bootstrap row), each group's unrolls arriving in the order it filled them.

    Row t of an unroll is frames t-S+1 .. t; the frames before its row 0 come from the stack its group's
    previous unroll ended with, kept per env (``hist``). Row 0 starts an episode where the policy said so
    when it acted on it: after an ignored step (the row before it, in the previous unroll), or in a group's
    first unroll after a restart (a new ``epoch``: its envs reset), or in its first unroll of all."""

    def __init__(self, stack: int, num_envs: int, envs_per_group: int, frame_shape, dtype, device):
        self.S, self.E = stack, envs_per_group
        self.hist = torch.zeros((num_envs, stack) + tuple(frame_shape), dtype=dtype, device=device)
        self.last_ignored = torch.ones(num_envs, dtype=torch.bool, device=device)  # row T-1's flag, per env
        self.epochs: dict[int, int] = {}

    def __call__(self, frames: torch.Tensor, ignored: torch.Tensor, groups: list[int],
                 epochs: list[int]) -> torch.Tensor:
        """[L, k*E, 1, H, W] frames and their [L, k*E] ``ignored`` flags, unroll j of group ``groups[j]``
        filled in ``epochs[j]`` -> [L, k*E, S, H, W]."""
        out = torch.empty(frames.shape[:2] + (self.S,) + frames.shape[3:], dtype=frames.dtype, device=frames.device)
        # A group that filled two unrolls of one batch: its second continues from its first, so in waves.
        nth = occurrence(np.asarray(groups))
        for js in (np.flatnonzero(nth == w).tolist() for w in range(int(nth.max(initial=-1)) + 1)):
            cols = torch.from_numpy((np.asarray(js)[:, None] * self.E + np.arange(self.E)).ravel()).to(frames.device)
            out[:, cols] = self._wave(frames[:, cols, 0], ignored[:, cols], [groups[j] for j in js],
                                      [epochs[j] for j in js])
        return out

    def _wave(self, frames: torch.Tensor, ignored: torch.Tensor, groups: list[int], epochs: list[int]) -> torch.Tensor:
        """Unrolls of distinct groups: [L, B, H, W] frames -> [L, B, S, H, W]."""
        S, (L, B) = self.S, frames.shape[:2]
        ids = torch.as_tensor([g * self.E + e for g in groups for e in range(self.E)], device=frames.device)
        restarted = np.repeat([self.epochs.get(g) != ep for g, ep in zip(groups, epochs)], self.E)
        first = torch.empty((L, B), dtype=torch.bool, device=frames.device)
        first[0] = self.last_ignored[ids] | torch.from_numpy(restarted).to(frames.device)
        first[1:] = ignored[:-1]
        # ext: the S-1 frames before row 0 (the previous stack's, repeats included), then the unroll's rows.
        ext = torch.cat([self.hist[ids][:, :S - 1].transpose(0, 1), frames], dim=0)  # [S-1+L, B, H, W]
        t = torch.arange(L, device=frames.device)
        # The row each row's episode began at (-(S-1): before this unroll, whose frames ext already holds).
        began = torch.where(first, t[:, None], -(S - 1)).cummax(0).values  # [L, B]
        idx = torch.maximum(t[:, None, None] + torch.arange(S, device=frames.device)[None, :, None],
                            began[:, None, :] + S - 1)  # [L, S, B] into ext
        stacks = ext[idx, torch.arange(B, device=frames.device)[None, None, :]].transpose(1, 2)  # [L, B, S, H, W]
        self.hist[ids] = stacks[-1]
        self.last_ignored[ids] = ignored[-2]
        self.epochs.update(zip(groups, epochs))
        return stacks
