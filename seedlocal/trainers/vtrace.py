"""``seedlocal train vtrace``: IMPALA on the SEED-style pipeline.

One process holds the model. Its inference thread serves the env workers with the learner's own parameters (a
``WeightLock`` orders only the optimiser's write against its reads); its main thread turns batches of finished
unrolls into V-trace updates (``algos/vtrace.py``). Unrolls go from shared memory to the device in one copy per
field (``Batcher``); by default actors wait while the learner works on a batch (``actors_wait``). The run's life
around this is ``trainers/run.py``'s.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from seedlocal.algos.frames import net_spec
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.arithmetic import apply_precision, resolve_precision
from seedlocal.monitor import nothing_stepped
from seedlocal.networks import checkpoint_network
from seedlocal.normalize import RewardScaler
from seedlocal.pipeline.batches import Batcher, Prefetcher
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.actor_critic import ModelPolicy
from seedlocal.prepare import Prepared
from seedlocal.recipes.vtrace import VTraceRun, build_model, identity
from seedlocal.trainers.population import PopulationTrainer
from seedlocal.trainers.run import WAIT_S, Run, blank, mean_of, rebuilding, run
from seedlocal.trainers.vtrace_interval import DIAGNOSTICS, VTraceLearning


class VTraceTrainer(VTraceLearning):
    checkpoint_parts = ("model", "optimizer", "counters")

    def __init__(self, prepared: Prepared, device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        cfg, a = self.cfg, self.cfg.algo
        self.model = build_model(cfg, self.spec).to(device)
        self.optimizer = make_optimizer(self.model.parameters(), a)
        # Minibatch order: one seeded CPU generator on every device (learner_step), each rank's and session's own.
        self.shuffle = torch.Generator().manual_seed(self.stream("shuffle"))
        self.precision = resolve_precision(a.precision, self.model.kind, device)
        apply_precision(self.precision, device)
        self.rows_per_batch = a.batch_size * cfg.pipeline.unroll_length
        self.lr = a.learning_rate
        self.prefetch = None  # once the pipeline runs (start)
        self.local_ep_sums = [0.0, 0.0]  # data-parallel ranks: this rank's episodes' returns and lengths, summed
        # As logged before any all-reduce: one that has found no episode yet leaves nothing for a last log.
        self.logged_ranks = {"sums": (0, 0.0, 0.0), "mean20": None}
        self.scaler = RewardScaler(self.shape.num_envs, a.discount) if a.reward_scale else None
        # What pools the running statistics' moments over the ranks; None for one process (no collective call).
        self.pool_moments = ranks.pool_moments if ranks.world > 1 else None

    def identity(self) -> dict:
        return identity(self.cfg, self.spec)

    def restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if "shuffle" in saved and self.ranks.rank == 0:  # checkpoints before it continue from the seed
            self.shuffle.set_state(saved["shuffle"])  # rank 0's, saved: another rank draws its own (``stream``)
        elif self.ranks.rank:
            self.shuffle.manual_seed(self.stream("shuffle"))
        if self.scaler is not None and "reward_scaler" in saved:
            self.scaler.load_state_dict(saved["reward_scaler"])

    def state(self) -> dict:
        out = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
               "shuffle": self.shuffle.get_state()}
        if self.scaler is not None:
            out["reward_scaler"] = self.scaler.state_dict()
        return out

    def acting_state(self) -> dict:
        return {"model": self.model.state_dict()}

    def describe(self) -> str:
        lstm = f" + LSTM {self.cfg.network.lstm_size}" if self.cfg.network.lstm_size else ""
        rhythm = "actors wait for each update, algo.sync on" if self.sync else "acting overlaps learning, algo.sync off"
        if self.cfg.algo.proximal == "batch":
            rhythm += "; the clip against the learner's policy at each batch's start, algo.proximal batch"
        stacked = f", {self.frame_stack} frames stacked beside the network" if self.frame_stack > 1 else ""
        return (f"training V-trace on {self.spec.env_id} ({self.model.kind} torso{lstm}{stacked}, {self.precision} "
                f"on {self.device}, {rhythm})")

    def join_ranks(self, ranks) -> None:
        """Data-parallel: every rank starts from rank 0's parameters and observation statistics (a resumed
        run's are equal already; the optimiser's state is too, fresh or loaded from the same checkpoint)."""
        ranks.broadcast_(self.model)

    def policy(self):
        return ModelPolicy(self.model, self.spec, self.lock, precision=self.precision,
                           cuda_graphs=self.cfg.pipeline.cuda_graphs, stack=self.frame_stack)

    def start(self, run: Run) -> None:
        # Actors wait for the learner (sync) by getting their unrolls back only after its update;
        # a synchronous learner holds one batch at a time: one set is enough.
        batcher = Batcher(run.pipe.store, run.pipe.layout.obs_keys(), self.shape.unrolls_per_batch, self.device,
                          sets=1 if self.sync else 2)
        self.prefetch = Prefetcher(run.loop, batcher, release_early=not self.sync)
        if not self.sync:
            self.prefetch.start()
        super().start(run)

    def target_return(self) -> float | None:
        return float(np.mean(self.recent)) if len(self.recent) == self.recent.maxlen else None

    def _more_sums(self) -> list:
        return self.local_ep_sums

    def _summed(self, episodes: float, reached: float | None, more: list) -> None:
        self.all_ranks = {"sums": (episodes, *more), "mean20": reached}  # every rank's episodes (sums), mean of means

    def advance(self, run: Run) -> str | None:
        """Wait for a batch of unrolls (gathered a batch ahead unless actors wait for the learner), learn from it."""
        cfg, iv = self.cfg, self.iv
        t0 = time.monotonic()
        run.watch.start()
        while (fetched := self.prefetch.next(timeout=WAIT_S)) is None:
            if run.waiting(t0):
                return "seconds"  # the budget ends while waiting (e.g. a hung env)
        t1 = self._waited(run, t0)
        batch, self.lr = self._take_batch(self.prefetch.batcher, fetched, self.optimizer, cfg.algo,
                                          self.counters["steps"], cfg.total_steps)
        acted_version, version0 = float(batch["policy_version"].mean()), run.loop.version
        batch = self._scale_rewards(batch, fetched)
        stats = learner_step(self.model, self.optimizer, batch, cfg.algo, step_lock=self.lock,
                             diagnose=iv.diag is None, precision=self.precision, after_update=self._bump_version,
                             shuffle=self.shuffle, ranks=self.ranks if self.ranks.world > 1 else None)
        self._update_obs_norm(batch)
        if iv.diag is None:  # once per logging interval: it copies the weights
            iv.diag = {key: stats.pop(key) for key in list(stats) if key.startswith(DIAGNOSTICS)}
        n_updates = stats.pop("updates")
        self.counters["updates"] += n_updates
        self._learned(stats, n_updates, version0, acted_version, cfg.algo.echo)
        self.prefetch.done(fetched)
        iv.learn_s += time.monotonic() - t1
        self._take_episodes(run)
        if self.ranks.world == 1 and run.summary.get("steps_to_target") is None and self.reaches(self.target_return()):
            # The mean that met the target: episodes that end while the run stops may move the final one below it.
            run.summary.update(steps_to_target=self._steps(run), return_at_target=float(np.mean(self.recent)))
        return None

    def _update_obs_norm(self, batch: dict) -> None:
        """Fold this batch's observations into the statistics, after its updates (under the lock:
        inference reads them). Before them, the learner would recompute pi under other statistics
        than the actors acted with, and pi/mu would leave 1 on the first pass of a sync run."""
        if self.model.obs_norm is not None:
            T = self.cfg.pipeline.unroll_length
            with self.lock:
                self.model.update_obs_norm({k: v[:T] for k, v in batch["obs"].items()}, pool=self.pool_moments)

    def _scale_rewards(self, batch: dict, fetched) -> dict:
        """The rewards' running scale, from this batch (on its host copy, in time order per env)."""
        if self.scaler is None:
            return batch
        host, T = self.prefetch.batcher.host[fetched.slot], self.cfg.pipeline.unroll_length
        E = self.shape.envs_per_group
        env_ids = (np.asarray(fetched.groups)[:, None] * E + np.arange(E)).ravel()
        self.scaler.update(host["reward"][:T], host["terminated"][:T] | host["truncated"][:T], env_ids,
                           ~host["ignored"][:T], pool=self.pool_moments)
        return {**batch, "reward": self.scaler(batch["reward"])}

    def _take_episodes(self, run: Run) -> None:
        eps = run.loop.stats.episodes.take()
        self.counters["episodes"] += eps.count
        self.local_episodes += eps.count
        self.local_ep_sums[0] += eps.return_sum
        self.local_ep_sums[1] += eps.length_sum
        self.recent.extend(r for r, _ in eps.recent[-self.recent.maxlen:])
        self.iv.add_episodes(eps)

    def log_due(self, run: Run, now: float) -> bool:
        return now - self.iv.t0 >= self.cfg.log_every_s

    def _scalars(self, run: Run, step_now: int) -> dict:
        return {"charts/learning_rate": self.lr, **self._all_ranks_episodes()}

    def _progress(self, step_now: int, values: dict) -> str:
        ret = f"{np.mean(self.recent):7.1f}" if self.recent else "      -"
        return (f"steps {step_now:>10,d}  frames/s {values['charts/frames_per_s']:>9,.0f}  return(20) {ret}  "
                f"updates {self.counters['updates']:,d}  loss {values['losses/total_loss']:.3f}  "
                f"entropy {values['losses/entropy']:.2f}")

    def _all_ranks_episodes(self) -> dict:
        """Data-parallel ranks: the episode scalars of every rank's episodes (as of the last all-reduce) since the
        last log, and the mean of the ranks' means of their last 20 (the target's); rank 0 writes them."""
        if not self.all_ranks:  # one process, or a run stopped in its first all-reduce
            return {}
        (n, ret, length), (n0, ret0, length0) = self.all_ranks["sums"], self.logged_ranks["sums"]
        self.logged_ranks = self.all_ranks
        return {"charts/episode_return": (ret - ret0) / (n - n0) if n > n0 else None,
                "charts/episode_length": (length - length0) / (n - n0) if n > n0 else None,
                "charts/return_mean20": self.all_ranks["mean20"]}

    def stop(self, run: Run) -> None:
        if self.prefetch is not None:
            self.prefetch.stop()

    def results(self, run: Run) -> dict:
        return {**super().results(run), "mean_return_last20": mean_of(self.recent)}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        ret = summary["mean_return_last20"]
        idle = ""
        if summary["steps"] and not summary["updates"]:
            idle = (f" (the budget ended before a first batch of algo.batch_size x pipeline.unroll_length = "
                    f"{self.rows_per_batch:,d} steps was learned from)")
        return (f"{summary['steps']:,d} steps, {summary['updates']:,d} updates{idle}, mean return (last 20) "
                f"{'-' if ret is None else f'{ret:.1f}'}", None if summary["steps"] else nothing_stepped(self.cfg))


def train(prepared: Prepared) -> dict:
    """Train until a budget ends; returns a summary (also on Ctrl-C, re-raised after saving). A population
    (``--population.size`` > 1) is ``trainers/population.py``'s."""
    return run(PopulationTrainer if prepared.config.population.size > 1 else VTraceTrainer, prepared, from_checkpoint)


def from_checkpoint(state: dict, device: torch.device, greedy: bool | None = None, epsilon: float = 0.0) -> ModelPolicy:
    """A checkpoint's network acting as training's inference serves it: sampling (``greedy`` None, as trained,
    or False), or its distribution's mode (True). ``epsilon`` is R2D2's; V-trace acts without it. The network
    is sized by the checkpoint's identity, as it was saved."""
    with rebuilding(state) as (ident, spec):
        stack = int(ident.get("frame_stack", 1))
        cfg = VTraceRun(network=checkpoint_network(ident, net_spec(spec, stack)), frame_stack=stack,
                        algo=VTraceParams(separate_critic=ident.get("separate_critic", False)))
        model = blank(lambda: build_model(cfg, spec))
        model.load_state_dict(state["model"])
    return ModelPolicy(model.to(device).eval(), spec, greedy=bool(greedy), stack=stack)


