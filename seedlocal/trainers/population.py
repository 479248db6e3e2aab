"""``seedlocal train vtrace --population.size P``: P V-trace learners in one run (issue 46; how the run is shared,
the three modes and PBT's round: docs/populations.md).

Each member (``Member``) is a learner with a contiguous block of whole env groups; its network's tensors are rows
of one ``MemberStack``, served in one vmapped call (``MembersPolicy``) while each learner writes its rows in place
(routing and learning: ``_ready``, ``together``). Not yet (refused by the recipe): data-parallel ranks, LSTM cores,
observation normalisation, reward scaling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from seedlocal.algos import pbt
from seedlocal.algos.member_stack import MemberStack
from seedlocal.algos.population_stats import iqm, summarize
from seedlocal.algos.population_vtrace import population_learner_step, shared_params
from seedlocal.algos.vtrace import VTraceParams, learner_step, make_optimizer
from seedlocal.arithmetic import apply_precision, resolve_precision
from seedlocal.errors import ConfigError
from seedlocal.monitor import nothing_stepped
from seedlocal.pipeline.batches import Batcher
from seedlocal.pipeline.inference import EpisodeLog
from seedlocal.pipeline.ranks import Solo
from seedlocal.policies.members import MembersPolicy
from seedlocal.prepare import Prepared
from seedlocal.recipes.vtrace import build_model, identity, member_values, pbt_space
from seedlocal.trainers.run import WAIT_S, Run, stream_seed
from seedlocal.trainers.vtrace_interval import VTraceLearning

CURVES = "population.csv"  # in the run folder: each member's mean of its last 20 episodes at each log
PLOT = "population.svg"  # beside it: the members' curves and their IQM


class Member:
    """One learner of the population (module docstring)."""

    def __init__(self, index: int, model, params: VTraceParams, names: list[str], seed: int, device):
        self.index, self.model, self.params = index, model, params
        self.optimizer = make_optimizer(model.parameters(), params)
        self.names = names  # the hyperparameters it has of its own (a sweep's, PBT's)
        self.shuffle = torch.Generator().manual_seed(stream_seed(seed, 0, "shuffle"))
        self.sampling = torch.Generator(device).manual_seed(stream_seed(seed, 0, "sampling"))
        self.counters = {"steps": 0, "updates": 0, "episodes": 0}
        self.recent: deque[float] = deque(maxlen=20)
        self.episodes = EpisodeLog()  # filled by the inference thread (MembersPolicy.plan)
        self.pending: list[int] = []  # finished unrolls of its groups, waiting for a batch
        self.lr = params.learning_rate
        self.restart_interval()

    def restart_interval(self) -> None:
        self.loss_sum, self.n, self.ep_n, self.ep_sum = 0.0, 0, 0, 0.0

    @property
    def values(self) -> dict:
        return {n: getattr(self.params, n) for n in self.names}

    def score(self) -> float | None:
        """The mean of its last 20 episodes (None before its first)."""
        return float(np.mean(self.recent)) if self.recent else None

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "sampling": self.sampling.get_state(), "values": self.values,  # (no shuffle: a resume draws afresh)
                "counters": dict(self.counters), "recent": list(self.recent)}

    def restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])  # in place: its tensors stay rows of the stack
        self.optimizer.load_state_dict(saved["optimizer"])  # (its shuffle: the trainer draws it afresh)
        self.sampling.set_state(saved["sampling"])  # a CUDA generator's state too is a CPU byte tensor
        self.params = dataclasses.replace(self.params, **saved["values"])
        self.counters.update(saved["counters"])
        self.recent.extend(saved["recent"])


class PopulationTrainer(VTraceLearning):
    checkpoint_parts = ("members", "population", "counters")

    def __init__(self, prepared: Prepared, device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        cfg, spec, pop = self.cfg, self.spec, self.cfg.population
        self.space = pbt_space(cfg) if pop.mode == "pbt" else {}
        values = member_values(cfg)
        names = list(dict.fromkeys([*values[0], *self.space]))
        self.members = []
        for m in range(pop.size):
            torch.manual_seed(cfg.env.seed + m)  # member 0 starts as the single learner of this seed would
            params = dataclasses.replace(cfg.algo, **values[m])
            self.members.append(Member(m, build_model(cfg, spec).to(device), params, names, cfg.env.seed + m, device))
        torch.manual_seed(cfg.env.seed)
        self.stack = MemberStack([mb.model for mb in self.members])
        self.precision = resolve_precision(cfg.algo.precision, self.members[0].model.kind, device)
        apply_precision(self.precision, device)
        self.k = self.shape.unrolls_per_batch // pop.size  # unrolls per member batch
        self.groups_per_member = self.shape.num_groups // pop.size
        self.rows_per_batch = self.k * self.shape.envs_per_group * cfg.pipeline.unroll_length
        self.pbt = pbt.PBTParams(pop.quantile, pop.resample_probability)
        # A stream of its own: default_rng(pop.seed) drew the sweep's starting values (pbt.sweep_values), and the
        # first round's choices then reused those very numbers (a resample gave member 3 its own starting rate).
        self.pbt_rng = np.random.default_rng([pop.seed, 1])
        self.lineage: list[dict] = []
        self.next_round = pop.interval
        self.curves: list[tuple[int, int, int, float]] = []  # (run steps, member, its steps, its mean of 20)

    # -- what a checkpoint holds -------------------------------------------------------------------------------

    def identity(self) -> dict:
        return {**identity(self.cfg, self.spec), "population": len(self.members)}

    def best(self) -> int:
        """The member whose last 20 episodes' mean is highest (members without episodes last)."""
        scores = [mb.score() for mb in self.members]
        return max(range(len(scores)), key=lambda m: (scores[m] is not None, scores[m] or 0.0, -m))

    def state(self) -> dict:
        return {"members": [mb.state() for mb in self.members],
                "population": {"size": len(self.members), "mode": self.cfg.population.mode, "best": self.best(),
                               "lineage": json.dumps(self.lineage), "next_round": self.next_round,
                               "pbt_rng": json.dumps(self.pbt_rng.bit_generator.state)}}

    def restore(self, saved: dict) -> None:
        start = self.counters["steps"]
        for mb, own in zip(self.members, saved["members"]):
            mb.restore(own)
            # A resumed session draws minibatches of its own (as a single learner's does); actions go on from the
            # saved sampling stream (Member.restore).
            mb.shuffle.manual_seed(stream_seed(self.cfg.env.seed + mb.index, 0, "shuffle", start))
        self.stack.check()
        p = saved["population"]
        self.lineage, self.next_round = json.loads(p["lineage"]), int(p["next_round"])
        self.pbt_rng.bit_generator.state = json.loads(p["pbt_rng"])

    def acting_state(self) -> dict:
        return {"model": self.members[self.best()].model.state_dict()}

    # -- running -----------------------------------------------------------------------------------------------

    def describe(self) -> str:
        pop = self.cfg.population
        mode = {"seeds": f"seeds {self.cfg.env.seed}..{self.cfg.env.seed + pop.size - 1}",
                "sweep": f"a sweep of {', '.join(self.members[0].names)}",
                "pbt": f"PBT over {', '.join(self.space)} every {pop.interval:,d} steps a member"}[pop.mode]
        E, groups = self.shape.envs_per_group, self.groups_per_member
        return (f"training a population of {pop.size} V-trace learners on {self.spec.env_id} ({mode}; each "
                f"{groups} env group{'s' * (groups != 1)} and batches of {self.k * E} of algo.batch_size's "
                f"{self.shape.unrolls_per_batch * E} unrolls; one inference call for "
                f"all, {self.precision} on {self.device}, members updating "
                f"{'in one batched update' if self.device.type == 'cuda' else 'one after another'})")

    def policy(self) -> MembersPolicy:
        return MembersPolicy(self.stack, self.spec, self.groups_per_member * self.shape.envs_per_group,
                             [mb.sampling for mb in self.members], self.lock, self.precision, self.frame_stack,
                             episodes=[mb.episodes for mb in self.members])

    def start(self, run: Run) -> None:
        keys = run.pipe.layout.obs_keys()
        for mb in self.members:
            mb.batcher = Batcher(run.pipe.store, keys, self.k, self.device, sets=1)
        super().start(run)

    def target_return(self) -> float | None:
        """The best mean of a member that has its 20 episodes."""
        return max((mb.score() for mb in self.members if len(mb.recent) == mb.recent.maxlen), default=None)

    def together(self) -> bool:
        """Whether every member learns in one batched update (``population_learner_step``) now: on CUDA, where P
        small updates would be P rounds of kernel launches, and while the members' hyperparameters share the
        update's shape (PBT may move them apart). On the CPU one after another: waiting for every member's batch
        would hold the members that are ready (though one batched update is faster there, ``population_vtrace``)."""
        if self.device.type == "cuda":
            with contextlib.suppress(ConfigError):
                shared_params([mb.params for mb in self.members])
                return True
        return False

    def _ready(self, run: Run, t0: float, every: bool) -> list[Member] | str:
        """The member to learn now: of those whose batch is full, the one with the fewest steps learned (``every``:
        all of them, once each is full), routing finished unrolls to their members meanwhile; or "seconds" if
        the time budget ends while waiting. Fewest steps first: by index, members starved one another
        (docs/populations.md, "members starved one another")."""
        group = run.pipe.store["unroll_group"]
        timeout = 0.0
        while True:
            try:
                buf = run.loop.completed.get(timeout=timeout) if timeout else run.loop.completed.get_nowait()
            except queue.Empty:
                full = [mb for mb in self.members if len(mb.pending) >= self.k]
                if full and (not every or len(full) == len(self.members)):
                    return full if every else [min(full, key=lambda mb: (mb.counters["steps"], mb.index))]
                if timeout and run.waiting(t0):
                    return "seconds"
                timeout = WAIT_S
                continue
            self.members[int(group[buf]) // self.groups_per_member].pending.append(buf)
            timeout = 0.0

    def advance(self, run: Run) -> str | None:
        """Wait for a member's batch (every member's, learning together), learn; a PBT round when one is due."""
        t0 = time.monotonic()
        run.watch.start()
        together = self.together()
        ready = self._ready(run, t0, together)
        if isinstance(ready, str):
            return ready
        t1 = self._waited(run, t0)
        taken = []
        for mb in ready:
            bufs, mb.pending = mb.pending[:self.k], mb.pending[self.k:]
            taken.append((mb, bufs, mb.batcher.fill(bufs, 0)))
            if not self.sync:  # copied: the actors may refill them while the member learns
                for b in bufs:
                    run.loop.release(b)
        self._learn(run, [(mb, self._batch(mb, fetched)) for mb, _, fetched in taken], together)
        for mb, bufs, fetched in taken:
            mb.batcher.done(fetched)
            for b in bufs if self.sync else ():
                run.loop.release(b)
        self.iv.learn_s += time.monotonic() - t1
        self._take_episodes(run)
        if self.cfg.population.mode == "pbt" and min(m.counters["steps"] for m in self.members) >= self.next_round:
            self.pbt_step(run.monitor)
        return None

    def _batch(self, mb: Member, fetched) -> dict:
        """A member's batch as its learner takes it, its learning rate decayed over its share of the step budget."""
        share = self.cfg.total_steps / len(self.members)
        batch, mb.lr = self._take_batch(mb.batcher, fetched, mb.optimizer, mb.params, mb.counters["steps"], share)
        return batch

    def _learn(self, run: Run, work: list[tuple[Member, dict]], together: bool) -> None:
        """Each member's ``learner_step`` in turn, or (``together``) one ``population_learner_step`` for all."""
        version0 = run.loop.version
        kw = dict(step_lock=self.lock, precision=self.precision, after_update=self._bump_version)
        if together:
            batches = [{k: v for k, v in b.items() if k != "policy_version"} for _, b in work]  # (a host array)
            stats = population_learner_step(self.stack, [mb.optimizer for mb, _ in work], batches,
                                            [mb.params for mb, _ in work], **kw,
                                            shuffles=[mb.shuffle for mb, _ in work])
            n = stats.pop("updates")
            each = [({k: v[i] for k, v in stats.items()}, n) for i in range(len(work))]
        else:
            each = []
            for mb, batch in work:
                one = learner_step(mb.model, mb.optimizer, batch, mb.params, shuffle=mb.shuffle, **kw)
                each.append((one, one.pop("updates")))
        losses = torch.stack([stats["total_loss"] for stats, _ in each]).tolist()  # one device sync, not P
        for (mb, batch), (stats, n), loss in zip(work, each, losses):
            self._learned(stats, n, version0, float(batch["policy_version"].mean()), mb.params.echo)
            mb.counters["updates"] += n
            mb.counters["steps"] += self.rows_per_batch
            self.counters["updates"] += n
            mb.loss_sum += loss
            mb.n += 1

    def pbt_step(self, monitor) -> list[pbt.Exploit]:
        """One round of PBT now (every member has an episode; else at its next batch): the bottom members take a
        top member's weights and optimizer state under the weight lock, then their explored hyperparameters;
        each record goes to the lineage and TensorBoard's text."""
        scores = [mb.score() for mb in self.members]
        if any(s is None for s in scores):
            return []
        step = min(mb.counters["steps"] for mb in self.members)
        values, records = pbt.pbt_round(scores, [mb.values for mb in self.members], self.space, self.pbt,
                                        self.pbt_rng, step)
        with self.lock:
            for r in records:
                donor, member = self.members[r.donor], self.members[r.member]
                pbt.copy_member(donor.model, donor.optimizer, member.model, member.optimizer)
        for r in records:
            member = self.members[r.member]
            member.params = dataclasses.replace(member.params, **values[r.member])
            member.recent.clear()  # its returns were its old weights'
            self.lineage.append(dataclasses.asdict(r))
            moves = ", ".join(f"{k} {r.copied[k]:.4g} -> {r.new[k]:.4g} ({r.how[k]})" for k in r.how)
            monitor.text("population/lineage", f"member {r.member} ({r.score:.2f}) <- member {r.donor} "
                         f"({r.donor_score:.2f}): {moves}", self.counters["steps"])
        self.next_round = (step // self.cfg.population.interval + 1) * self.cfg.population.interval
        return records

    def _take_episodes(self, run: Run) -> None:
        self.iv.add_episodes(run.loop.stats.episodes.take())
        for mb in self.members:
            eps = mb.episodes.take()
            mb.counters["episodes"] += eps.count
            self.counters["episodes"] += eps.count
            mb.ep_n += eps.count
            mb.ep_sum += eps.return_sum
            mb.recent.extend(r for r, _ in eps.recent[-mb.recent.maxlen:])
            self.recent.extend(r for r, _ in eps.recent[-self.recent.maxlen:])

    def _progress(self, step_now: int, values: dict) -> str:
        best, iqm_ = values.get("population/best"), values.get("population/iqm")
        shown = "      -" if best is None else f"best {best:7.1f}  IQM {iqm_:7.1f}"
        return (f"steps {step_now:>10,d}  frames/s {values['charts/frames_per_s']:>9,.0f}  "
                f"return(20) {shown}  updates {self.counters['updates']:,d}")

    def _scalars(self, run: Run, step_now: int) -> dict:
        """Each member's curve (``member_<m>/...``) and the population's best, median and IQM of the members'
        last-20 means (once every member has episodes)."""
        out: dict = {}
        for mb in self.members:
            score = mb.score()
            mine = {"charts/episode_return": mb.ep_sum / mb.ep_n if mb.ep_n else None, "charts/return_mean20": score,
                    "charts/steps": mb.counters["steps"], "charts/learning_rate": mb.lr,
                    "losses/total_loss": mb.loss_sum / mb.n if mb.n else None,
                    **{f"hyper/{k}": float(v) for k, v in mb.values.items()}}
            out.update({f"member_{mb.index}/{k}": v for k, v in mine.items()})
            if score is not None:
                self.curves.append((step_now, mb.index, mb.counters["steps"], score))
            mb.restart_interval()
        scores = [mb.score() for mb in self.members]
        if all(s is not None for s in scores):
            out.update({"population/best": max(scores), "population/median": float(np.median(scores)),
                        "population/iqm": iqm(scores)})
        return out

    def results(self, run: Run) -> dict:
        best = self.best()
        finals = [mb.score() for mb in self.members]
        stats = dataclasses.asdict(summarize(finals)) if all(f is not None for f in finals) else None
        members = [{"member": mb.index, "values": mb.values, **mb.counters, "mean_return_last20": finals[mb.index]}
                   for mb in self.members]  # counters: steps, updates, episodes
        write_curves(run.run_dir, self.curves)
        return {**super().results(run), "mean_return_last20": finals[best],
                "population": {"size": len(self.members), "mode": self.cfg.population.mode, "best": best,
                               "summary": stats, "members": members, "lineage": self.lineage}}

    def outcome(self, summary: dict) -> tuple[str, str | None]:
        pop = summary["population"]
        line = f"{summary['steps']:,d} steps, {summary['updates']:,d} updates over {pop['size']} members"
        s = pop["summary"]
        if s is None:
            line += "; not every member finished an episode: no population statistics"
        else:
            line += (f"; members' mean return (last 20 each): mean {s['mean']:.1f} [{s['mean_ci'][0]:.1f}, "
                     f"{s['mean_ci'][1]:.1f}], IQM {s['iqm']:.1f} [{s['iqm_ci'][0]:.1f}, {s['iqm_ci'][1]:.1f}] "
                     f"(95% bootstrap CI); best member {pop['best']}: {summary['mean_return_last20']:.1f}")
        return line, None if summary["steps"] else nothing_stepped(self.cfg)


def write_curves(run_dir: Path, curves: list[tuple[int, int, int, float]]) -> None:
    """``CURVES`` (run steps, member, member steps, mean of its last 20) and ``PLOT``: each member's curve (grey)
    and their IQM at each log (black), in plain SVG so that the plot needs no plotting library."""
    if not curves:
        return
    lines = ["run_steps,member,member_steps,return_mean20"] + [f"{a},{m},{b},{r:.6g}" for a, m, b, r in curves]
    (run_dir / CURVES).write_text("\n".join(lines) + "\n")
    by_step: dict[int, list[float]] = {}
    for a, _, _, r in curves:
        by_step.setdefault(a, []).append(r)
    iqm_line = [(a, iqm(v)) for a, v in sorted(by_step.items())]
    x0, x1 = min(by_step), max(max(by_step), min(by_step) + 1)
    y0, y1 = min(r for *_, r in curves), max(max(r for *_, r in curves), min(r for *_, r in curves) + 1e-9)
    W, H, M = 640, 360, 40

    def path(points, style: str) -> str:
        xy = " ".join(f"{M + (a - x0) / (x1 - x0) * (W - 2 * M):.1f},{H - M - (r - y0) / (y1 - y0) * (H - 2 * M):.1f}"
                      for a, r in points)
        return f'<polyline fill="none" {style} points="{xy}"/>'

    members = sorted({m for _, m, _, _ in curves})
    body = [path([(a, r) for a, mm, _, r in curves if mm == m], 'stroke="#999" stroke-width="1"') for m in members]
    body.append(path(iqm_line, 'stroke="black" stroke-width="2.5"'))
    text = (f'<text x="{M}" y="20" font-size="12">mean return (last 20) of {len(members)} members (grey) and their '
            f'IQM (black), {y0:.3g} .. {y1:.3g}, over run steps {x0:,d} .. {x1:,d}</text>')
    (run_dir / PLOT).write_text(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">'
                                f'<rect width="100%" height="100%" fill="white"/>{text}{"".join(body)}</svg>\n')
