"""``seedlocal train r2d2``: recurrent prioritized replay on the SEED pipeline (docs/r2d2.md, "How it runs").

The inference thread acts epsilon-greedily on the online network's Q-values, each env slot with its own epsilon
(Ape-X's schedule); a few *evaluation* slots (``eval_env_ids``) act with ``eval_epsilon``, never write to replay,
and give the return ``--stop-at-return`` tests. The main thread keeps the replay fed at ``replay_ratio``
(``replay_feeder.py``), samples prioritized sequences (staged ahead on CUDA: ``BatchStager``), learns and writes
the new priorities back.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from seedlocal.algos.frames import net_spec, stacking
from seedlocal.algos.r2d2 import learner_step, per_env_epsilons
from seedlocal.arithmetic import apply_precision
from seedlocal.errors import ConfigError
from seedlocal.monitor import nothing_stepped
from seedlocal.networks import checkpoint_network
from seedlocal.pipeline.cuda import WeightLock
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.q_greedy import R2D2Policy
from seedlocal.prepare import Prepared
from seedlocal.recipes.r2d2 import R2D2Run, build_net, identity
from seedlocal.shm.rollout import obs_key
from seedlocal.trainers.replay import SequenceReplay
from seedlocal.trainers.replay_feeder import BatchStager, ReplayFeeder, replay_from_checkpoint, replay_to_checkpoint
from seedlocal.trainers.run import WAIT_S, Run, StepTrainer, blank, mean_of, rebuilding, run


def eval_env_ids(num_local: int, num_envs: int, eval_envs: int) -> np.ndarray:
    """The evaluation slots: the last local envs (actor hosts may come late, or never: --stop-at-return must not
    wait for them), and only where there are too few local ones, the last remote envs."""
    last = num_local if eval_envs <= num_local else num_envs
    return np.arange(last - eval_envs, last)


def make_replay(cfg: R2D2Run, spec, num_envs: int, core_shape, seed: int) -> SequenceReplay:
    """``seed``: its sampler's (``Trainer.stream``: each learner rank samples its own)."""
    a = cfg.algo
    fields = {obs_key(k): (s.shape, s.dtype) for k, s in spec.obs.items()}
    fields.update({"action": (spec.action.shape, spec.action.dtype), "reward": ((), "float32"),
                   "terminated": ((), "bool"), "truncated": ((), "bool"), "ignored": ((), "bool")})
    return SequenceReplay(num_envs=num_envs, sequences=a.replay_size, length=a.burn_in + a.unroll_length + 1,
                          stride=a.unroll_length, fields=fields, core_shape=core_shape,
                          stack=stacking(spec, cfg.frame_stack), alpha=a.priority_exponent, compress=cfg.compress,
                          seed=seed)


class R2D2Trainer(StepTrainer):
    checkpoint_parts = ("model", "target", "optimizer", "counters")

    def __init__(self, prepared: Prepared, device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        cfg, spec = self.cfg, self.spec
        a = self.a = cfg.algo
        self.online = build_net(cfg, spec).to(device)
        apply_precision(self.online.precision, device)
        self.target = self.online.frozen_copy()
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=a.learning_rate, eps=a.adam_eps)
        num_envs = self.shape.num_envs
        evaluating = np.isin(np.arange(num_envs), eval_env_ids(self.shape.num_local_envs, num_envs, a.eval_envs))
        self.eps = torch.full((num_envs,), a.eval_epsilon)
        self.eps[torch.from_numpy(~evaluating)] = per_env_epsilons(num_envs - a.eval_envs, a.epsilon_base,
                                                                  a.epsilon_alpha)
        self.replay = make_replay(cfg, spec, num_envs - a.eval_envs, self.online.core_spec.shape, self.stream("replay"))
        self.feeder = ReplayFeeder(self.replay, evaluating, self.shape.envs_per_group, a.unroll_length, a.replay_ratio,
                                   a.batch_size, a.min_replay)
        self.stager, self.staged = BatchStager(device, [obs_key(k) for k in spec.obs]), []
        self.lock = WeightLock(device)
        self.acc: dict[str, torch.Tensor] = {}  # learner statistics since the last log (device sums)
        self.sampled_p: list[float] = []
        self.dropped = 0
        self._waiting = None  # when this wait for data began (None: learning)
        self._all_behind = False  # data-parallel ranks: every rank owes the replay ratio an update (spent)

    def identity(self) -> dict:
        return identity(self.cfg, self.spec)

    def restore(self, saved: dict) -> None:
        self.online.load_state_dict(saved["model"])
        self.target.load_state_dict(saved["target"])
        self.optimizer.load_state_dict(saved["optimizer"])
        if "replay" not in saved or self.ranks.world > 1:
            if "replay" in saved and self.ranks.main:
                print("seedlocal: the checkpoint's replay is one process's: each learner rank starts with an empty "
                      "replay", flush=True)
            # An empty replay samples from this session's own stream (a restored one goes on with its saved one).
            self.replay.rng = np.random.default_rng(self.stream("replay"))
        else:
            try:
                self.replay.load_state_dict(replay_from_checkpoint(saved["replay"]))
            except ValueError as e:
                raise ConfigError(f"resume: {e}; resume with the saved run's pipeline and replay settings, or "
                                  "without its replay (a checkpoint written without --checkpoint-replay)") from None
            print(f"seedlocal: replay restored with {self.replay.size:,d} sequences", flush=True)

    def state(self) -> dict:
        replay = {"replay": replay_to_checkpoint(self.replay.state_dict())} if self.cfg.checkpoint_replay else {}
        return {"model": self.online.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), **replay}

    def acting_state(self) -> dict:
        return {"model": self.online.state_dict()}

    def describe(self) -> str:
        a, acting = self.a, int((~self.feeder.evaluating).sum())
        return (f"training R2D2 on {self.spec.env_id} ({self.online.kind} torso in {self.online.precision} + LSTM "
                f"{self.cfg.network.lstm_size}, {acting} acting + {a.eval_envs} evaluation envs, replay "
                f"{a.replay_size:,d} sequences{', lz4' if self.cfg.compress else ''})")

    def join_ranks(self, ranks) -> None:
        """Data-parallel: every rank starts from rank 0's online and target networks; each keeps its own replay."""
        ranks.broadcast_(self.online)
        ranks.broadcast_(self.target)

    def policy(self):
        stack = stacking(self.spec, self.cfg.frame_stack)
        return R2D2Policy(self.online, self.spec, self.eps, self.lock, self.device, stack, self.stream("epsilon"),
                          cuda_graphs=self.cfg.pipeline.cuda_graphs)

    def learner_threads(self) -> int:
        # A small MLP + LSTM update gains nothing from more threads, and OpenMP threads that wait on each
        # other while env workers hold the cores made CartPole updates ~50x slower on a loaded 2-core box.
        big = self.online.kind in ("nature", "impala")
        return super().learner_threads() if big else (self.cfg.pipeline.learner_threads or 1)

    def start(self, run: Run) -> None:
        super().start(run)
        self.log_steps, self.inserted0, self.log_updates = self.steps0, self.replay.added, self.counters["updates"]
        self.logged_episodes = self.counters["episodes"]

    def target_return(self) -> float | None:
        on = self.feeder.recent_eval if self.a.eval_envs else self.feeder.recent_train
        return float(np.mean(on)) if len(on) == on.maxlen else None

    def _more_sums(self) -> list:
        """The ranks learn (``advance``) only when all of them owe the replay ratio an update, so that their
        gradients' all-reduces meet; and they log the mean over the ranks of their training and evaluation
        returns."""
        f = self.feeder
        return [f.behind(), mean_of(f.recent_train) or 0.0, bool(f.recent_train), mean_of(f.recent_eval) or 0.0,
                bool(f.recent_eval)]

    def _summed(self, episodes: float, reached: float | None, more: list) -> None:
        behind, train, n_train, ev, n_ev = more
        self._all_behind = behind == self.ranks.world
        # The mean over ranks of their last 20 training and evaluation returns.
        self.all_ranks = {"train": train / n_train if n_train else None, "eval": ev / n_ev if n_ev else None}

    def advance(self, run: Run) -> str | None:
        """Learn while the learner owes the replay ratio, else take unrolls (waiting briefly for them)."""
        run.runner.check()
        if self._all_behind if self.ranks.world > 1 else self.feeder.behind():
            self._learn()
            return None
        now, first = time.monotonic(), self.feeder.added_steps == 0
        if self.feeder.take(run.loop, WAIT_S):
            self._waiting = None
            self._take_episodes(run)
            if first:  # the interval from the first unroll on: the workers' start-up is no slow first point
                run.logged_at, self.log_steps = time.monotonic(), self._steps(run)
            return None
        if self._waiting is None:  # time spent learning before this wait is no stall
            self._waiting = now
            run.watch.start()
        elif run.waiting(self._waiting):
            return "seconds"
        return None

    def _learn(self) -> None:
        a, r, stager = self.a, self.replay, self.stager
        batch, slots, gens, weights = self.staged.pop() if self.staged else stager.stage(
            r.sample(a.batch_size, a.importance_exponent))
        stats, prio = learner_step(self.online, self.target, self.optimizer, batch, weights, a, step_lock=self.lock,
                                   ranks=self.ranks if self.ranks.world > 1 else None)
        prio = stager.priorities_to_host(prio)
        if stager.ahead:  # the next batch, sampled and copied while this update runs on the device
            self.staged.append(stager.stage(r.sample(a.batch_size, a.importance_exponent)))
        self.dropped += len(slots) - r.update_priorities(slots, gens, stager.read(prio))
        self.sampled_p.extend(r.tree.get(slots).tolist())
        self.counters["updates"] += 1
        self.feeder.learned()
        if self.counters["updates"] % a.target_update_every == 0:
            self.target.load_state_dict(self.online.state_dict())
        for k, v in {**stats, "n": 1}.items():
            self.acc[k] = self.acc.get(k, 0) + v

    def _take_episodes(self, run: Run) -> None:
        self.counters["episodes"] += self.feeder.episodes
        self.local_episodes += self.feeder.episodes
        self.feeder.episodes = 0

    def log(self, run: Run, now: float, last: bool = False) -> None:
        a, f, r, c = self.a, self.feeder, self.replay, self.counters
        step_now, dt = self._steps(run), max(1e-9, now - run.logged_at)
        n = max(1, self.acc.pop("n", 0))
        values = {f"losses/{k}": float(v) / n for k, v in self.acc.items()}  # device sums, read once
        train, ev = self._returns()
        self.logged_ranks = dict(self.all_ranks)
        values.update({
            "charts/episode_return": train, "charts/eval_return": ev, "charts/episodes": c["episodes"],
            "charts/replay_ratio": f.learned_rows / max(1, f.added_steps),
            "replay/size": r.size, "replay/priority_mean": float(np.mean(self.sampled_p)) if self.sampled_p else None,
            "replay/priority_max": float(np.max(self.sampled_p)) if self.sampled_p else None,
            "replay/stale_updates_dropped": self.dropped, "perf/worker_restarts": run.loop.stats.restarts,
        })
        rates = not last or dt >= self.cfg.log_every_s / 4  # no rates from a fraction of an interval
        if rates:
            values.update({
                "charts/steps_per_s": (step_now - self.log_steps) / dt,
                "charts/frames_per_s": (step_now - self.log_steps) / dt * self.frames_per_step,
                "replay/insert_per_s": (r.added - self.inserted0) / dt,
                "replay/sample_per_s": (c["updates"] - self.log_updates) * a.batch_size / dt,
                "perf/updates_per_s": (c["updates"] - self.log_updates) / dt,
            })
        # Reset first: an interval is written once, whatever follows.
        self.log_steps, self.acc, self.sampled_p = step_now, {}, []
        self.inserted0, self.log_updates, self.logged_episodes = r.added, c["updates"], c["episodes"]
        run.scalars(step_now, values, rates)
        if last:
            return
        shown = f"{ev:7.1f}" if ev is not None else "      -"
        # After the warm-up (algo.min_replay) the learner catches up on the replay ratio, actors parked: say so.
        owed = f.owed_updates()
        run.monitor.progress(f"steps {step_now:>10,d}  frames/s {values.get('charts/frames_per_s', 0):>8,.0f}  "
                             f"eval return(20) {shown}  updates {c['updates']:,d}  "
                             f"replay {r.size:,d}  td {values.get('losses/td_abs', 0):.3f}"
                             + (f"  (actors wait: {owed:,d} updates to replay ratio {a.replay_ratio:g})"
                                if owed > 1 else ""))

    def _returns(self) -> tuple[float | None, float | None]:
        """The mean training and evaluation returns of the last 20 episodes: this process's, or with
        data-parallel ranks the mean over the ranks of theirs (as of the last all-reduce)."""
        if self.ranks.world > 1 and self.all_ranks:
            return self.all_ranks["train"], self.all_ranks["eval"]
        return mean_of(self.feeder.recent_train), mean_of(self.feeder.recent_eval)

    def has_last_log(self) -> bool:
        # Episodes that end after the last update belong on the curve too (start() sets the count they add to).
        return super().has_last_log() or bool(self.acc) or (
            hasattr(self, "steps0") and self.counters["episodes"] != self.logged_episodes)

    def results(self, run: Run) -> dict:
        train, ev = self._returns()
        return {**super().results(run), "mean_return_last20": train, "eval_return_last20": ev,
                "target_return_source": "eval" if self.a.eval_envs else "train"}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        ret = summary["eval_return_last20"] if self.a.eval_envs else summary["mean_return_last20"]
        return (f"{summary['steps']:,d} steps, {'evaluation' if self.a.eval_envs else 'training'} return (last 20) "
                f"{'-' if ret is None else f'{ret:.1f}'}", None if summary["steps"] else nothing_stepped(self.cfg))


def train(prepared: Prepared) -> dict:
    return run(R2D2Trainer, prepared, from_checkpoint)


def from_checkpoint(state: dict, device: torch.device, greedy: bool | None = None, epsilon: float = 0.0) -> R2D2Policy:
    """A checkpoint's online network acting as training's evaluation slots do: epsilon-greedy with ``epsilon``
    (greedy None or True), its frames stacked as in training. Its draws come from a seeded host generator. The
    network is sized by the checkpoint's identity, as it was saved."""
    if greedy is False:
        raise ConfigError("policy=sample: R2D2 acts epsilon-greedily on Q-values, which are not a distribution "
                          "to sample; use --policy trained or argmax")
    with rebuilding(state) as (ident, spec):
        stack = int(ident["frame_stack"])
        cfg = R2D2Run(frame_stack=stack, network=checkpoint_network(ident, net_spec(spec, stack)))
        net = blank(lambda: build_net(cfg, spec, device))
        net.load_state_dict(state["model"])
    return R2D2Policy(net.to(device).eval(), spec, epsilon, WeightLock(device), device,
                      stack if "" in spec.obs else 1, seed=0, draws_on="cpu")


