"""Unrolls to learner batches: the one-copy gather and the prefetch thread."""

import threading
import time

import numpy as np
import torch

from helpers import tiny_pipeline
from seedlocal.networks import ActorCritic
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.pipeline.batches import Batcher, Prefetcher


def reference_batch(store, bufs, obs_keys):
    """The time-major layout written out the slow, obvious way: row t, column
    j*E + e is step t of env e of unroll bufs[j]."""
    def tm(name):
        a = np.stack([np.array(store[name][b]) for b in bufs])  # [k, L, E, ...]
        k, L, E = a.shape[:3]
        out = np.empty((L, k * E) + a.shape[3:], a.dtype)
        for j in range(k):
            for t in range(L):
                for e in range(E):
                    out[t, j * E + e] = a[j, t, e]
        return out

    batch = {k: tm(k) for k in obs_keys + ["action", "reward", "terminated", "ignored", "out.logits"]}
    batch["core_state"] = np.concatenate([np.array(store["core_state"][b]) for b in bufs])
    return batch


def lstm_policy(spec, device):
    return ModelPolicy(ActorCritic(spec, lstm_size=8), spec)


def test_batcher_matches_the_reference_layout_and_releases_in_sync_order():
    """Prefetched batches equal the reference layout field by field; with
    release_early off (algo.sync) the unrolls return to the actors only when
    the learner says it is done, so the loop's free list stays empty meanwhile."""
    with tiny_pipeline(lstm_policy, num_workers=1, envs_per_worker=4, unroll_length=6, num_buffers=4) as pipe:
        loop, store = pipe.loop, pipe.store
        obs_keys = pipe.layout.obs_keys()
        batcher = Batcher(store, obs_keys, k=2, device=torch.device("cpu"))
        prefetch = Prefetcher(loop, batcher, release_early=False)
        stop = threading.Event()
        server = threading.Thread(target=lambda: [loop.step() for _ in iter(stop.is_set, True)], daemon=True)
        prefetch.start()
        server.start()
        try:
            slots = set()
            for _ in range(3):
                fetched = None
                while fetched is None:
                    fetched = prefetch.next(timeout=0.5)
                batch = batcher.use(fetched)
                ref = reference_batch(store, fetched.bufs, obs_keys)
                for name in obs_keys:
                    np.testing.assert_array_equal(batch["obs"]["" if name == "obs" else name[4:]].numpy(), ref[name])
                for name, key in (("action", "action"), ("reward", "reward"), ("terminated", "terminated"),
                                  ("ignored", "ignored"), ("out.logits", "behaviour_logits")):
                    np.testing.assert_array_equal(batch[key].numpy(), ref[name])
                np.testing.assert_array_equal(batch["core_state"].numpy(), ref["core_state"])
                assert batch["obs"][""].shape == (7, 4, 4)  # [L, k * E, obs]: two unrolls of a 2-env group
                time.sleep(0.2)  # the learner "works": its unrolls stay out of the actors' hands
                assert all(b not in loop.unrolls._free for b in fetched.bufs)
                slots.add(fetched.slot)
                prefetch.done(fetched)
            assert slots == {0, 1}  # two host sets, used in turn
        finally:
            stop.set()
            prefetch.stop()
            server.join(10)
        assert not prefetch.is_alive()


def test_prefetcher_hands_a_failure_to_the_learner():
    class Broken(Batcher):
        def fill(self, bufs, slot):
            raise RuntimeError("copy failed")

    with tiny_pipeline(lstm_policy, num_workers=1, envs_per_worker=4, unroll_length=6) as pipe:
        prefetch = Prefetcher(pipe.loop, Broken(pipe.store, pipe.layout.obs_keys(), 1, torch.device("cpu")),
                              release_early=True)
        prefetch.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pipe.loop.step()
                try:
                    if prefetch.next(timeout=0.01) is not None:
                        raise AssertionError("a batch from a failed copy")
                except RuntimeError as e:
                    assert "copy failed" in str(e)
                    break
            else:
                raise AssertionError("the failure never reached the learner")
        finally:
            prefetch.stop()


def test_one_block_to_host_returns_every_field_exactly():
    """The packed device-to-host path (used on accelerators) gives back the
    same arrays, dtypes and shapes as copying each field on its own."""
    from seedlocal.pipeline.inference import to_host

    actions = torch.tensor([0, 5, 3, 16_000_000])
    outputs = {"logits": torch.randn(4, 6), "value": torch.randn(4), "core": torch.randn(4, 2, 3)}
    want_a, want_o = to_host(actions, outputs, pack=False)
    got_a, got_o = to_host(actions, outputs, pack=True)
    np.testing.assert_array_equal(got_a, want_a)
    assert got_a.dtype == want_a.dtype and list(got_o) == list(want_o)
    for k in want_o:
        np.testing.assert_array_equal(got_o[k], want_o[k])
        assert got_o[k].dtype == want_o[k].dtype and got_o[k].shape == want_o[k].shape
    cont_a, _ = to_host(torch.rand(4, 2), {}, pack=True)  # continuous actions
    assert cont_a.shape == (4, 2) and cont_a.dtype == np.float32
