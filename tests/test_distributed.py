"""Data-parallel learners (issue 34, pipeline/ranks.py): two gloo ranks in separate processes, each with half a
batch, against one process with the whole of it."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

import dist_ranks
from seedlocal.pipeline.ranks import Solo, free_port


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What each of 2 gloo ranks computed from its half of ``dist_ranks.batch()`` (one group for both tests)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(dist_ranks.rank_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("kind", ["plain", "normalized"])
def test_a_data_parallel_step_equals_one_process_step_over_the_whole_batch(two_ranks, kind):
    """echo 1, minibatches 1: two ranks' update from half a batch each (different numbers of valid rows; rank 1
    starting from other weights, which the broadcast replaces) is one process's update from the whole batch,
    gradient clipping included; with advantage normalisation too, its moments taken over both halves."""
    whole = dist_ranks.step(dist_ranks.batch(), kind == "normalized")
    start = torch.nn.utils.parameters_to_vector(dist_ranks.model_and_params(False)[0].parameters()).detach()
    assert not torch.allclose(whole, start)  # the step moved the weights
    for r in range(2):
        torch.testing.assert_close(two_ranks[r][kind], whole, rtol=1e-5, atol=1e-6)
    assert torch.equal(two_ranks[0][kind], two_ranks[1][kind])  # the ranks stay identical, bit for bit


def test_pooled_statistics_equal_the_whole_batch(two_ranks):
    """Observation normalisation, the reward scaler and advantage normalisation, pooled over the ranks' halves,
    are the whole batch's statistics."""
    b = dist_ranks.batch()
    whole = dist_ranks.statistics(b)
    L, B = dist_ranks.L, dist_ranks.B
    adv = torch.randn(L - 1, B, generator=torch.Generator().manual_seed(1))
    mean, std = Solo().masked_moments(adv, ~b["ignored"][:L - 1])
    for r in range(2):
        got = two_ranks[r]["stats"]
        assert got["obs_count"] == whole["obs_count"] == L * B
        torch.testing.assert_close(got["obs_mean"], whole["obs_mean"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["obs_var"], whole["obs_var"], rtol=1e-12, atol=1e-12)
        assert got["reward"] == pytest.approx(whole["reward"], rel=1e-12)
        assert two_ranks[r]["adv_moments"] == pytest.approx((float(mean), float(std)), rel=1e-6)
