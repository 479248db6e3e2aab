"""The Atari preset's learner must learn from pixels: a CI guard for Pong.

Pong is too slow for CI, so these tests run the preset's own loss, optimiser,
initialisation and Nature CNN on ``tests/image_catch.py`` (Catch drawn on
4 x 84 x 84 uint8 frames, reward 6 steps after the decision), through the real
pipeline and ``train()``. The preset before issue 7 (RMSProp with eps 0.01 on
a mean loss) stays at the random policy's return here.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import describe
from seedlocal.recipes.vtrace import PRESETS, build_model
from seedlocal.trainers.vtrace import train
from helpers import prepared

CATCH = "image_catch:ImageCatch1-v0"  # single frames, stacked 4 beside the network as the preset does
CATCH_BUDGET = 150_000  # agent steps for the preset to reach a mean return of 3 (of 5) on Catch
# The preset as it was before issue 7: it never left the uniform policy on Pong.
OLD_ATARI = VTraceParams(batch_size=32, learning_rate=6e-4, optimizer="rmsprop", optimizer_eps=0.01,
                         entropy_cost=0.01, reward_clip=1.0, separate_critic=False)


def catch_config(tmp_path, algo: VTraceParams, steps: int, **kw):
    preset = PRESETS["atari"]
    return dataclasses.replace(
        preset, env=EnvConfig(id=CATCH, seed=kw.pop("seed", 1)), algo=algo,
        pipeline=dataclasses.replace(preset.pipeline, num_workers=1, envs_per_worker=16, env_threads=1),
        total_steps=steps, log_dir=str(tmp_path), run_name=kw.pop("run_name", "catch"), progress=False,
        log_every_s=1.0, checkpoint_every_min=60.0, **kw)


# 3.5 minutes on 2 cores, the longest test of the default run (clean-clone CI, 2026-11-26): run with -m slow.
# In the default run the MinAtar preset's Breakout test keeps a CNN learning from pixels through the
# pipeline, and test_train_vtrace runs the Atari preset itself (no learning bar there).
@pytest.mark.slow
def test_atari_preset_learns_catch_from_pixels(tmp_path):
    cfg = catch_config(tmp_path, PRESETS["atari"].algo, CATCH_BUDGET, stop_at_return=3.0)
    summary = train(prepared(cfg))
    # A random policy scores about -2.7 over the 5 balls of an episode.
    assert summary["steps_to_target"] is not None, f"no mean return of 3 within {CATCH_BUDGET} steps: {summary}"
    assert summary["return_at_target"] >= 3.0, summary


@pytest.mark.slow
def test_old_preset_does_not_learn_catch(tmp_path):
    """The guard above fails on the settings issue 7 replaced: with the same
    budget the old preset stays near the random policy's return."""
    summary = train(prepared(catch_config(tmp_path, OLD_ATARI, CATCH_BUDGET, stop_at_return=3.0)))
    assert summary["steps_to_target"] is None and summary["mean_return_last20"] < 1.0, summary


def random_batch(L: int = 21, B: int = 8) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "obs": {"": torch.randint(0, 256, (L, B, 4, 84, 84), dtype=torch.uint8, generator=g)},
        "action": torch.randint(0, 6, (L, B), generator=g),
        "reward": torch.randint(-1, 2, (L, B), generator=g).float(),
        "terminated": torch.zeros(L, B, dtype=torch.bool),
        "ignored": torch.zeros(L, B, dtype=torch.bool),
        "behaviour_logits": torch.zeros(L, B, 6),
        "core_state": None,
    }


def test_update_ratio_diagnostic_measures_the_step_taken():
    """losses/update_ratio and update_ratio/<name> report |w_new - w_old| / |w_old|
    of the update just applied (the diagnostic that exposes a stuck optimiser)."""
    torch.manual_seed(0)
    spec = describe(CATCH)
    algo = dataclasses.replace(PRESETS["atari"].algo, echo=1, minibatches=1)  # one update per step
    model = build_model(PRESETS["atari"], spec)
    opt = make_optimizer(model.parameters(), algo)
    batch = random_batch()
    before = {n: w.detach().clone() for n, w in model.named_parameters()}
    stats = learner_step(model, opt, batch, algo, diagnose=True)
    ratios = []
    for name, w in model.named_parameters():
        if w.dim() > 1:
            expected = float((w.detach() - before[name]).norm() / before[name].norm())
            assert stats[f"update_ratio/{name}"] == pytest.approx(expected, rel=1e-4)
            ratios.append(expected)
    assert stats["update_ratio"] == pytest.approx(float(torch.tensor(ratios).median()), rel=1e-4)
    assert 1e-5 < stats["update_ratio"] < 1e-1
    for key in ("advantage_std", "value_error", "explained_variance"):
        assert key in stats and stats[key] == stats[key]  # present and not NaN


def test_update_ratio_flags_the_old_presets_stuck_optimiser():
    """What issue 7 found on Pong: RMSProp's eps 0.01 (tuned for a loss summed
    over 640 rows) swamps the gradient of a mean loss, so weights barely move.
    On a batch with Pong's sparse rewards the diagnostic shows it at once: the
    old optimiser's steps are an order of magnitude below a healthy ~1e-3."""
    spec = describe(CATCH)
    batch = random_batch()
    batch["reward"].zero_()
    batch["reward"][15, 3], batch["reward"][20, :2] = -1.0, 1.0
    ratios = {}
    for name, algo in (("old", OLD_ATARI), ("new", PRESETS["atari"].algo)):
        torch.manual_seed(0)
        model = build_model(dataclasses.replace(PRESETS["atari"], algo=algo), spec)
        one = dataclasses.replace(algo, echo=1, minibatches=1)
        ratios[name] = learner_step(model, make_optimizer(model.parameters(), one), batch, one,
                                    diagnose=True)["update_ratio"]
    assert ratios["old"] < 5e-4 and ratios["new"] > 1e-3, ratios
