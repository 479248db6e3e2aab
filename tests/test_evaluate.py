"""``seedlocal eval`` acts on the device it is given: observations and the
recurrent core go to the model's device, actions come back to the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlocal.config.schema import EnvConfig
from seedlocal.envs.spaces import validate_env
from seedlocal.evaluate import _R2D2Player, play
from seedlocal.networks import ActorCritic, PolicyNet, RecurrentQNet


def _models():
    """Every kind of network eval plays, each over an env of its kind."""
    cartpole = validate_env(EnvConfig(id="CartPole-v1"))
    pendulum = validate_env(EnvConfig(id="Pendulum-v1"))
    torch.manual_seed(0)
    return {
        "actor-critic with an LSTM core": (ActorCritic(cartpole, lstm_size=16), cartpole, True),
        "actor-critic over a Box, sampled": (ActorCritic(pendulum), pendulum, False),
        "neuroevolution policy over a Box": (PolicyNet(pendulum, obs_norm=True), pendulum, True),
        "R2D2 Q-network": (_R2D2Player(RecurrentQNet(cartpole, lstm_size=16), 1), cartpole, True),
    }


@pytest.mark.parametrize("kind", list(_models()))
def test_eval_runs_the_network_on_its_device(kind):
    """On the meta device a forward computes shapes and no values, and any
    host tensor mixed into it is refused. So the first error is copying the
    action back out: the observations, the core and the forward were all on
    the model's device (before the fix, a CPU observation met meta weights)."""
    model, spec, greedy = _models()[kind]
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        play(model.to("meta").eval(), spec, episodes=2, greedy=greedy, seed=1, max_steps=5, epsilon=0.1)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", list(_models()))
def test_eval_on_cuda_plays_as_on_the_cpu(kind):
    """The same network, greedy, on the same seeds: the same returns on the GPU as on the CPU."""
    model, spec, _ = _models()[kind]
    model.eval()
    cpu, _ = play(model, spec, episodes=3, greedy=True, seed=1, max_steps=300, epsilon=0.05)
    gpu, _ = play(model.to("cuda"), spec, episodes=3, greedy=True, seed=1, max_steps=300, epsilon=0.05)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-2)
