"""``seedlocal train ga|es|ars|random-search``: neuroevolution on the pipeline.

Once per generation the learner thread runs the run config's evolver (``EVOLVERS``, ``trainers/evolvers.py``) on
the ``PopulationPolicy`` (the inference thread's work queue of member x episode jobs, ``policies/population.py``),
then logs and checkpoints.

Counters: ``generation``, ``frames`` and ``episodes`` advance by whole generations, and a checkpoint holds them
with the state they produced. A long generation (Atari: minutes) is followed while it runs: the progress line and
the frame budget see its frames as they are stepped, and a run that stops inside it reports them in summary.json
(its ``frames`` are the checkpoint's plus those). The checkpoint still holds the last whole generation, so a
resumed run evaluates the abandoned one again and counts its frames anew. With ``--learners G`` each rank
evaluates its part of every population (docs/distributed.md) and the budgets are judged between generations.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from seedlocal.algos.neuroevo import ParamSpace
from seedlocal.networks import checkpoint_network
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.population import PopulationPolicy
from seedlocal.prepare import Prepared
from seedlocal.recipes.neuroevolution import (ARSRun, ESRun, GARun, NeuroevoRun, RandomSearchRun, build_policy,
                                              episode_frame_cap, fitness_shift, identity)
from seedlocal.trainers.evolvers import ARSEvolver, ESEvolver, Evolver, GAEvolver, RandomSearchEvolver
from seedlocal.trainers.run import Run, Trainer, blank, rebuilding, run


def episode_step_cap(prepared: Prepared) -> int:
    """``episode_frame_cap`` in agent steps: an episode ends at the first step whose frames reach the cap."""
    return -(-episode_frame_cap(prepared.config, prepared.kind) // prepared.spec.frames_per_step)


EVOLVERS: dict[type, type[Evolver]] = {GARun: GAEvolver, ESRun: ESEvolver, ARSRun: ARSEvolver,
                                       RandomSearchRun: RandomSearchEvolver}


LONG_GENERATION_S = 120.0  # a generation this long is told about, once


class _BudgetSpent(Exception):
    """A budget (``args[0]``: "seconds" or "frames") ended inside a generation."""


class NeuroevoTrainer(Trainer):
    x_axis = "generation"
    checkpoint_parts = ("algo_state", "best_params", "best_return", "counters")
    consume = False  # unrolls are scratch here: no learner reads them

    def __init__(self, prepared: Prepared, device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        cfg, spec = self.cfg, self.spec
        self.template = build_policy(cfg, spec)
        self.evolver = EVOLVERS[type(cfg)](cfg, ParamSpace(self.template))
        self.counters = {"generation": 0, "frames": 0, "episodes": 0}
        self.gen_s, self.frames_run = 0.0, 0  # time inside generations (this session): the rate leaves start-up out
        self.reached, self.generated = False, False
        self.values: dict = {}
        self._inside: float | None = None  # when the generation in evaluation began; None between generations
        self._obs_norm = self.template.obs_norm  # as of the last whole generation (see advance)

    def identity(self) -> dict:
        return identity(self.cfg, self.spec)

    def restore(self, saved: dict) -> None:
        self.evolver.restore(saved["algo_state"])
        self.evolver.best_params, self.evolver.best_return = saved["best_params"], saved["best_return"]
        if self.template.obs_norm is not None:
            self.template.obs_norm.load_state_dict(saved["obs_norm"])

    def _obs_stats(self) -> dict:
        """The population's shared observation statistics (no genome holds them), as a checkpoint holds them."""
        return {} if self._obs_norm is None else {"obs_norm": self._obs_norm.state_dict()}

    def state(self) -> dict:
        return {"algo_state": self.evolver.state_dict(), "best_params": self.evolver.best_params,
                "best_return": self.evolver.best_return, **self._obs_stats()}

    def acting_state(self) -> dict | None:
        """The best member so far (the elite, the ES centre), as a checkpoint holds it."""
        return None if self.evolver.best_params is None else {"best_params": self.evolver.best_params,
                                                               **self._obs_stats()}

    def position(self) -> tuple[int, int]:
        return self.counters["generation"], self.counters["frames"]

    def join_ranks(self, ranks) -> None:
        """Split populations (``trainers/evolvers.py``): every rank holds the same state already, from the run's
        seed or the same checkpoint."""
        self.evolver.ranks = ranks

    def describe(self) -> str:
        cap = episode_frame_cap(self.cfg, self.prepared.kind)
        return (f"{self.algo} on {self.spec.env_id}, {self.evolver.space.size:,d} parameters per network"
                + (f", episodes cut at {cap:,d} frames" if cap else ""))

    def policy(self):
        cfg = self.cfg
        self.population = PopulationPolicy(self.template, self.shape.envs_per_group, self.shape.num_groups,
                                           self.device, greedy=cfg.greedy, strategy=cfg.forward,
                                           action_noise=cfg.action_noise, reward_shift=fitness_shift(cfg, self.spec),
                                           max_episode_steps=episode_step_cap(self.prepared),
                                           pool_stats=self.ranks.pool_moments if self.ranks.world > 1 else None)
        return self.population

    def learner_threads(self) -> int:
        return self.cfg.pipeline.learner_threads or torch.get_num_threads()

    def start(self, run: Run) -> None:
        self._counted = self._totals(run.loop)  # ``_totals`` when the counters last advanced

    def spent(self, run: Run) -> str | None:
        cfg, c = self.cfg, self.counters
        if self.reached:
            return "target"
        return next((budget for budget, over in (
            ("generations", cfg.generations and c["generation"] >= cfg.generations),
            ("frames", cfg.total_frames and c["frames"] >= cfg.total_frames),
            ("seconds", self._out_of_time(run))) if over), None)

    def _out_of_time(self, run: Run) -> bool:
        """Whether the time budget has ended: for one rank, for all (a rank that stopped alone would leave the
        others waiting in the next fitness all-gather)."""
        return run.out_of_time() if self.ranks.world == 1 else bool(self.ranks.sum([float(run.out_of_time())])[0])

    def _totals(self, loop) -> tuple[int, int, int, int]:
        """Running totals the counters advance by: rows served to members (each one step of a member's episode),
        env steps (idle slots and auto-reset steps too: a group steps all its envs), evaluation episodes scored,
        and those of them the frame cap ended."""
        pop = self.population
        return pop.forward_envs, loop.stats.env_steps, pop.episodes_scored, pop.episodes_capped

    def _uncounted(self) -> tuple[int, int]:
        """(frames, episodes) of the generation in evaluation so far (since the counters last advanced)."""
        pop, (served, _, scored, _) = self.population, self._counted
        return (pop.forward_envs - served) * self.frames_per_step, pop.episodes_scored - scored

    def advance(self, run: Run) -> str | None:
        """One generation, evaluated in the pipeline, then its scalars."""
        pop, pool = self.population, run.pipe.pool
        t0 = self._inside = time.monotonic()
        w0, fwd0 = pool.worker_stats(), pop.forward_s
        self.generated = False
        try:
            stats = self.evolver.generation(pop, self._watch_generation(run, t0))
        except _BudgetSpent as spent:
            return spent.args[0]  # still inside: the summary counts what this generation stepped
        # The statistics the next population plays under (committed inside the generation): a checkpoint pairs
        # them with the state that asked it.
        self._obs_norm = self.template.obs_norm
        self._count_generation(run, stats, t0, w0, fwd0)
        if self.cfg.stop_at_return and stats["best_member_return"] >= self.cfg.stop_at_return:
            c = self.counters
            self.reached = True  # spent() says so once this generation is logged and saved
            run.summary.update(generations_to_target=c["generation"], frames_to_target=c["frames"],
                               steps_to_target=c["frames"] // self.frames_per_step)
        self.generated = True
        return None

    def _watch_generation(self, run: Run, t0: float) -> Callable[[], None]:
        """What a generation calls every 0.5 s while it waits for episodes (Job.wait: a blocking wait). The budgets
        hold inside a generation too (long or endless episodes, a hung env), abandoning it (``_BudgetSpent``); the
        checkpoint keeps the last whole one."""
        c, told, watching = self.counters, [False], [False]

        def check() -> None:
            if not watching[0]:
                # The envs owe steps from the first wait on, not while the population is built (seconds).
                watching[0] = True
                run.watch.start()
            if run.waiting(t0):
                raise _BudgetSpent("seconds")
            # Data-parallel ranks judge budgets between generations only, together (``spent``).
            if (self.cfg.total_frames and self.ranks.world == 1
                    and c["frames"] + self._uncounted()[0] >= self.cfg.total_frames):
                raise _BudgetSpent("frames")
            self._progress_inside(run, t0)
            if time.monotonic() - t0 >= LONG_GENERATION_S and not told[0]:
                told[0] = True
                print(f"\nseedlocal: generation {c['generation'] + 1} has waited {LONG_GENERATION_S:.0f} s for its "
                      "episodes to end (members are scored on whole episodes; if this env's episodes never end, "
                      "cap them with --max-episode-frames N, register it with a time limit, "
                      "gymnasium.register(..., max_episode_steps=N), or give --seconds)", flush=True)

        return check

    def _count_generation(self, run: Run, stats: dict, t0: float, w0: dict, fwd0: float) -> None:
        """The counters advance by the generation just evaluated (begun at ``t0``, when the workers' times were
        ``w0`` and the forward time ``fwd0``), and its scalars are made."""
        loop, pop, c = run.loop, self.population, self.counters
        dt = time.monotonic() - t0
        self.gen_s += dt
        # Read once: the inference thread goes on serving the next population, whose rows are the next generation's.
        counted = self._totals(loop)
        moved = [now - then for now, then in zip(counted, self._counted)]
        if self.ranks.world > 1:  # every rank's: the counters and rank 0's scalars are the run's
            moved = [int(v) for v in self.ranks.sum(moved)]
        served, stepped, scored, capped = moved
        self._counted, self._inside = counted, None
        frames, w1 = served * self.frames_per_step, run.pipe.pool.worker_stats()
        c["generation"] += 1
        c["frames"] += frames
        self.frames_run += frames
        c["episodes"] += scored
        loop.stats.episodes.take()
        self.values = {
            **{f"charts/{k}": v for k, v in stats.items()}, "charts/frames": c["frames"],
            "charts/episodes": c["episodes"], "perf/frames_per_generation": frames, "perf/frames_per_s": frames / dt,
            "perf/idle_share": 1.0 - served / stepped if stepped else 0.0, "perf/generation_s": dt,
            "perf/env_time_s": (w1["env_s"] - w0["env_s"]) / max(1, w1["threads"]),
            "perf/inference_time_s": pop.forward_s - fwd0,
            "perf/capped_share": capped / scored if scored else 0.0,
            "perf/worker_restarts": loop.stats.restarts,
        }

    def _progress_inside(self, run: Run, t0: float) -> None:
        """The progress line while a generation runs (the monitor rate-limits it)."""
        jobs, pop = self.evolver.evaluating, self.population
        frames = self._uncounted()[0]
        dt = max(time.monotonic() - t0, 1e-9)
        run.monitor.progress(
            f"gen {self.counters['generation'] + 1:>4d}  members {sum(j.members_done() for j in jobs):>4d}"
            f"/{sum(len(j.returns) for j in jobs)} finished  frames {self.counters['frames'] + frames:>12,d}  "
            f"frames/s {frames / dt:>9,.0f}  longest episode {pop.longest_running() * self.frames_per_step:,d} "
            f"frames  {dt:,.0f} s")

    def log_due(self, run: Run, now: float) -> bool:
        return self.generated  # once per generation, with the generation as the x axis

    save_due = log_due

    def log(self, run: Run, now: float, last: bool = False) -> None:
        v = self.values
        run.scalars(self.counters["generation"], v)
        run.monitor.progress(
            f"gen {self.counters['generation']:>4d}  best {v['charts/best_fitness']:8.1f}  "
            f"mean {v['charts/mean_fitness']:8.1f}  best member {v['charts/best_member_return']:8.1f}  "
            f"frames {self.counters['frames']:>12,d}  frames/s {v['perf/frames_per_s']:>9,.0f}")

    def results(self, run: Run) -> dict:
        c, best = self.counters, self.evolver.best_return
        # A run stopped inside a generation (budget, Ctrl-C, error) reports the frames it stepped there too.
        inside = self._inside is not None
        more_frames, more_episodes = self._uncounted() if inside else (0, 0)
        gen_s = self.gen_s + (time.monotonic() - self._inside if inside else 0.0)
        frames = c["frames"] + more_frames
        return {"generations": c["generation"], "steps": frames // self.frames_per_step, "frames": frames,
                "episodes": c["episodes"] + more_episodes, "best_member_return": best if math.isfinite(best) else None,
                "frames_per_s": round((self.frames_run + more_frames) / gen_s, 1) if gen_s else None,
                "forward": self.population.forward.strategy, "population": self.cfg.algo.population_size,
                **{k: run.summary.get(k) for k in ("generations_to_target", "steps_to_target", "frames_to_target")}}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        best = f"{self.evolver.best_return:.1f}" if math.isfinite(self.evolver.best_return) else "-"
        g = self.counters["generation"]
        frames = summary.get("frames", self.counters["frames"])  # with a generation stopped inside
        return (f"{g} generations, {frames:,d} frames, best member return {best}",
                None if g else "stopped before the first generation ended")


def train(prepared: Prepared) -> dict:
    return run(NeuroevoTrainer, prepared, from_checkpoint)


def from_checkpoint(state: dict, device: torch.device, greedy: bool | None = None,
                    epsilon: float = 0.0) -> PopulationPolicy:
    """A checkpoint's best member acting alone by the population's rule: argmax or a sample over Discrete
    actions as the run's ``greedy`` option said (``greedy`` None) or as asked, the output itself over a Box; with
    the population's observation statistics. ``epsilon`` is R2D2's; neuroevolution acts without it."""
    with rebuilding(state) as (ident, spec):
        cfg = NeuroevoRun(network=checkpoint_network(ident, spec))
        net = blank(lambda: build_policy(cfg, spec))
        torch.nn.utils.vector_to_parameters(state["best_params"].float(), net.parameters())
        if net.obs_norm is not None:  # the population's shared statistics, saved beside the genomes
            net.obs_norm.load_state_dict(state["obs_norm"])
    trained = bool(state.get("config", {}).get("greedy", True))
    return PopulationPolicy.serving(net.to(device).eval(), spec, greedy=trained if greedy is None else greedy)
