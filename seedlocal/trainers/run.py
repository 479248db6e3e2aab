"""One run's life, the same for every trainer: ``run(Trainer, prepared)`` owns everything around the algorithm,
in the order docs/architecture.md gives ("A run, from the command line to its trainer"); a ``Trainer`` supplies
the parts that differ (its hooks). ``Run`` is what a trainer sees of the run while it goes: the pipeline, the
clock and the helpers every wait needs (``Run.waiting`` checks the inference thread, the stall watch, the bridge
and the time budget).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import random
import shlex
import time
import zlib
from collections import deque
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from seedlocal import checkpoint
from seedlocal.config.checks import resolve_device, split_address, usable_cores
from seedlocal.config.resume import resume_line
from seedlocal.errors import ConfigError
from seedlocal.monitor import RunMonitor, closing_line
from seedlocal.pipeline.actors import start_server
from seedlocal.pipeline.bridge.server import BridgeMeter
from seedlocal.pipeline.inference import InferenceThread, StallWatch
from seedlocal.pipeline.pipeline import Pipeline
from seedlocal.pipeline.policy import Policy
from seedlocal.pipeline.ranks import Solo, join
from seedlocal.prepare import Prepared, checkpoint_spec, for_rank
from seedlocal.shape import PipelineShape
from seedlocal.trainers.videos import TrainingVideos

WAIT_S = 0.5  # how often a trainer waiting for data checks the run (Run.waiting)


class Trainer(abc.ABC):
    """An algorithm's parts, for ``run``. Subclasses set ``x_axis`` (the counter TensorBoard's x axis and
    checkpoint names follow) and fill ``counters`` in ``__init__``."""

    x_axis: str = "steps"
    checkpoint_parts: tuple[str, ...] = ("counters",)
    """what a checkpoint must hold for this trainer to resume it"""
    consume: bool = True
    """whether the learner takes full unrolls (False: they are free again at once)"""

    def __init__(self, prepared: Prepared, device: torch.device, ranks: Solo = Solo()):
        """``prepared``: the run (a data-parallel rank's share of it, one of ``ranks``: ``prepare.for_rank``)."""
        self.prepared, self.algo = prepared, prepared.recipe.name  # the algorithm's name in summaries and errors
        self.cfg, self.spec, self.device, self.ranks = prepared.config, prepared.spec, device, ranks
        self.counters: dict[str, int] = {}
        self.frames_per_step = prepared.spec.frames_per_step
        self.shape: PipelineShape = prepared.shape  # the trainer sizes its own parts by it; the pipeline takes it

    # -- building and saving ----------------------------------------------------

    @abc.abstractmethod
    def identity(self) -> dict:
        """What a checkpoint must match to be resumed or evaluated with this config."""

    @abc.abstractmethod
    def restore(self, saved: dict) -> None:
        """Take a checkpoint's state (its counters are taken already)."""

    @abc.abstractmethod
    def state(self) -> dict:
        """What a checkpoint holds besides identity, config and counters."""

    def position(self) -> tuple[int, int]:
        """(x, frames) that name a checkpoint now."""
        steps = self.counters[self.x_axis]
        return steps, steps * self.frames_per_step

    def stream(self, purpose: str) -> int:
        """The seed of this trainer's random stream ``purpose`` (``stream_seed``), for this rank and session."""
        return stream_seed(self.cfg.env.seed, self.ranks.rank, purpose, self.counters.get(self.x_axis, 0))

    # -- running --------------------------------------------------------------------

    @abc.abstractmethod
    def describe(self) -> str:
        """What the first line says is being trained (before the TensorBoard hint)."""

    @abc.abstractmethod
    def policy(self) -> Policy:
        """What the inference loop runs (built once)."""

    def acting_state(self) -> dict | None:
        """What this family's ``from_checkpoint`` needs besides identity and config to act as the run acts
        now (the acting network's weights; no optimiser, no replay), for the videos during training
        (``videos.py``); None: nothing to act with yet, or no videos from this trainer."""
        return None

    def learner_threads(self) -> int:
        """The learner's torch threads: ``pipeline.learner_threads``, or by default every usable core."""
        return self.cfg.pipeline.learner_threads or usable_cores()

    def join_ranks(self, ranks: Solo) -> None:
        """Be one of ``ranks``' learners (data-parallel, ``pipeline/ranks.py``): a trainer that can makes its
        parameters equal here; one that cannot refuses more than one (its recipe refuses --learners > 1 first, but
        torchrun's ranks may leave --learners out)."""
        if ranks.world > 1:
            raise ConfigError(f"learners={ranks.world}: {self.algo} has no data-parallel learner; give --learners 1")

    def start(self, run: "Run") -> None:
        """The pipeline and its inference thread are up."""

    @abc.abstractmethod
    def spent(self, run: "Run") -> str | None:
        """The budget (or target) that has ended, if one has: the run stops."""

    @abc.abstractmethod
    def advance(self, run: "Run") -> str | None:
        """One unit of learning (an update, a generation); what ended the run while it waited ("seconds"), or None."""

    def log_due(self, run: "Run", now: float) -> bool:
        return now - run.logged_at >= self.cfg.log_every_s

    def save_due(self, run: "Run", now: float) -> bool:
        return now - run.saved_at >= self.cfg.checkpoint_every_min * 60

    @abc.abstractmethod
    def log(self, run: "Run", now: float, last: bool = False) -> None:
        """Scalars (and the progress line unless ``last``, the run's final, partial interval) for the time since
        the last call."""

    def has_last_log(self) -> bool:
        """Whether the interval since the last log holds anything to write at the end."""
        return False

    def stop(self, run: "Run") -> None:
        """Stop this trainer's own threads (before the inference thread stops)."""

    def settle(self, run: "Run") -> None:
        """Final accounting once every thread has stopped."""

    @abc.abstractmethod
    def results(self, run: "Run") -> dict:
        """What summary.json reports (besides status, run_dir, stopped_by, algo, env, seconds, checkpoint)."""

    @abc.abstractmethod
    def outcome(self, summary: dict) -> tuple[str, str | None]:
        """(what the run reached, for the closing line; why nothing was done, or None)."""


class StepTrainer(Trainer):
    """A trainer counted in env steps (V-trace, R2D2, a population of V-trace learners): its counters are steps,
    updates and episodes, and the step budget, the time budget or ``--stop-at-return`` ends it (``spent``),
    judged by one process, or by data-parallel ranks together in one all-reduce per update."""

    peer_steps = 0
    """data-parallel ranks: the other ranks' steps, as of the last all-reduce"""
    local_episodes = 0
    """data-parallel ranks: this rank's episodes"""

    def __init__(self, prepared: Prepared, device: torch.device, ranks: Solo = Solo()):
        super().__init__(prepared, device, ranks)
        self.counters = {"steps": 0, "updates": 0, "episodes": 0}
        # Data-parallel ranks: what the trainer logs of every rank's episodes, as of the last all-reduce (``_summed``)
        # and as of the last log.
        self.all_ranks: dict = {}
        self.logged_ranks: dict = {}

    @abc.abstractmethod
    def target_return(self) -> float | None:
        """This process's mean return that ``--stop-at-return`` tests, once it has its 20 episodes (else None)."""

    def start(self, run: "Run") -> None:
        self.steps0, self.episodes0 = self.counters["steps"], self.counters["episodes"]

    def _steps(self, run: "Run") -> int:
        return self.steps0 + run.loop.stats.env_steps + self.peer_steps

    def reaches(self, mean: float | None) -> bool:
        return bool(self.cfg.stop_at_return) and mean is not None and mean >= self.cfg.stop_at_return

    def spent(self, run: "Run") -> str | None:
        if self.ranks.world > 1:
            late, reached = self._spent_together(run)
        else:
            self.counters["steps"] = self._steps(run)
            late, reached = run.out_of_time(), self.target_return()
        if self.cfg.total_steps and self.counters["steps"] >= self.cfg.total_steps:
            return "steps"
        if late:
            return "seconds"
        if not self.reaches(reached):
            return None
        if run.summary.get("steps_to_target") is None:  # (V-trace's advance records it when it is met)
            run.summary["steps_to_target"], run.summary["return_at_target"] = self.counters["steps"], reached
        return "target"

    def _spent_together(self, run: "Run") -> tuple[bool, float | None]:
        """``spent``'s counts for data-parallel ranks, in one all-reduce per update: the step budget counts every
        rank's steps, the time budget ends for all when it ends for one, and the target is the mean of the ranks'
        means (once each has its 20 episodes). Returns (the time budget has ended, that mean or None)."""
        own, local = self.target_return(), run.loop.stats.env_steps
        steps, episodes, returns, n_full, late, *more = self.ranks.sum(
            [local, self.local_episodes, 0.0 if own is None else own, own is not None, run.out_of_time(),
             *self._more_sums()])
        reached = returns / n_full if n_full == self.ranks.world else None
        self.peer_steps = int(steps) - local
        # The all-reduced total, not _steps(run): that re-reads this rank's counter, which the inference thread
        # has moved on since, so ranks would judge the budget on different counts and one would stop alone.
        self.counters["steps"], self.counters["episodes"] = self.steps0 + int(steps), self.episodes0 + int(episodes)
        self._summed(episodes, reached, more)
        return bool(late), reached

    def _more_sums(self) -> list:
        """Data-parallel ranks: what else this rank adds to ``spent``'s all-reduce."""
        return []

    def _summed(self, episodes: float, reached: float | None, more: list) -> None:
        """Data-parallel ranks: ``spent``'s all-reduce found the ranks' ``episodes`` this session, their mean of
        means ``reached`` and the sums of ``_more_sums``."""

    @abc.abstractmethod
    def _take_episodes(self, run: "Run") -> None:
        """The episodes that ended since the last call, into the counters and curves."""

    def settle(self, run: "Run") -> None:
        if hasattr(self, "steps0"):  # started: the steps and episodes of this session
            self.counters["steps"] = self._steps(run)
            self._take_episodes(run)

    def has_last_log(self) -> bool:
        # With ranks, an all-reduce after the last log (spent() runs after log()) that moved the ranks' means, which
        # is what stopped a run at its target.
        return bool(self.all_ranks) and self.all_ranks != self.logged_ranks

    def results(self, run: "Run") -> dict:
        c, to_target = self.counters, run.summary.get("steps_to_target")
        return {"steps": c["steps"], "frames": c["steps"] * self.frames_per_step, "updates": c["updates"],
                "episodes": c["episodes"], "steps_to_target": to_target,
                "return_at_target": run.summary.get("return_at_target"),
                "frames_to_target": to_target * self.frames_per_step if to_target is not None else None}


class Run:
    """What a trainer sees of the run while it goes."""

    def __init__(self, trainer: Trainer, pipe, monitor: RunMonitor, run_dir: Path, summary: dict, saved_cfg):
        """``summary``: what summary.json will hold (a trainer records when it met the target there);
        ``saved_cfg``: the config checkpoints hold (the trainer's ``cfg`` is one data-parallel rank's share of it)."""
        self.cfg, self.trainer, self.pipe, self.monitor, self.run_dir = trainer.cfg, trainer, pipe, monitor, run_dir
        self.summary, self.saved_cfg = summary, saved_cfg
        self.loop = pipe.loop
        self.runner = InferenceThread(pipe.loop)
        remote = pipe.pool.num_remote_groups
        self.meter = BridgeMeter(pipe.pool.control, remote) if remote else None
        self.watch = StallWatch(pipe.loop, after=self.cfg.pipeline.stall_s)
        self.t_start = self.logged_at = self.saved_at = time.monotonic()
        self._said_waiting, self._said_no_host = 0.0, False

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def scalars(self, step: int, values: dict, rates: bool = True) -> None:
        """A trainer's scalars to TensorBoard (and W&B), with the bridge's when actor hosts serve this run: every
        trainer's ``log`` writes through here, so none can leave the ``bridge/`` curves out. ``rates`` False (the
        last log, a fraction of an interval): the bridge's rates would be noise, so none are added."""
        if self.meter is not None and rates:
            values = {**values, **self.meter.scalars()}
        self.monitor.scalars(step, values)

    def no_host_yet(self, now: float) -> None:
        """Once, 3 x ``pipeline.stall_s`` in (30 s): remote groups that no actor host has taken while the local
        envs keep the run going (where the trainer waits for data, ``waiting`` says so every 10 s)."""
        if self.meter is None or self._said_no_host or now - self.t_start < 3 * self.cfg.pipeline.stall_s:
            return
        self._said_no_host = True
        if line := self.meter.waiting_line():
            print(f"{line} after {now - self.t_start:.0f} s; training goes on with the local envs", flush=True)

    def out_of_time(self) -> bool:
        return bool(self.cfg.seconds) and self.elapsed() >= self.cfg.seconds

    def waiting(self, since: float) -> bool:
        """For a trainer waiting for data (every ``WAIT_S``): raise what the inference thread raised, say so when
        envs stop stepping or actor hosts are missing, and return True once the time budget has ended (so a hung
        env cannot hold the run past it)."""
        self.runner.check()
        now = time.monotonic()
        if self.meter is not None and now - since > 10 and now - self._said_waiting > 10:
            self._said_waiting = now
            if line := self.meter.waiting_line():
                print(line, flush=True)
        self.watch.poll()
        # Data-parallel ranks decide the time budget together (in the trainer's ``spent``): one that stopped
        # waiting alone would leave the others in the gradient's all-reduce.
        return self.out_of_time() and self.trainer.ranks.world == 1

    def save(self) -> None:
        t = self.trainer
        checkpoint.save(self.run_dir, {"identity": t.identity(), "config": dataclasses.asdict(self.saved_cfg),
                                       **t.state(), "counters": dict(t.counters), "rng": rng_state()},
                        *t.position(), keep=self.cfg.keep_checkpoints)
        self.saved_at = time.monotonic()


def rng_state() -> dict:
    """The process-wide generators a run draws from (action sampling, init, exploration), for a checkpoint."""
    # numpy's state as plain numbers and a tensor: checkpoints load with weights_only=True.
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    out = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": {"kind": str(kind), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                     "has_gauss": int(has_gauss), "gauss": float(gauss)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def stream_seed(seed: int, rank: int, purpose: str, start: int = 0) -> int:
    """The seed of one of a run's random streams: ``purpose`` names it (the process's generators, R2D2's replay
    sampler and epsilon draws, V-trace's minibatch order), ``rank`` is the learner rank drawing from it and
    ``start`` the count of steps (generations) its session starts from, so that every rank and every resumed
    session draws its own numbers (numpy's SeedSequence mixes them). One process's first session keeps ``seed``
    itself, as before ranks had streams of their own."""
    if rank == 0 and start == 0:
        return seed
    entropy = [seed % 2**63, rank, start, zlib.crc32(purpose.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)


def seed_generators(seed: int) -> None:
    """Every process-wide generator from the run's seed, once, before the trainer draws its networks."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def restore_generators(saved: dict | None) -> None:
    """A resumed run continues the generators where its checkpoint left them (``rng_state``), so it
    does not replay the action noise of the run's start; a checkpoint from before they were saved
    continues from the seed, as before."""
    if not saved:
        return
    torch.set_rng_state(saved["torch"])
    n = saved["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(saved["python"])
    if "cuda" in saved and torch.cuda.is_available():
        # A checkpoint may come from a machine with more GPUs: restore those this one has.
        for i, state in enumerate(saved["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, i)


@contextmanager
def rebuilding(state: dict):
    """Rebuild a checkpoint's network from what it yields, the checkpoint's identity and env (``checkpoint_spec``):
    what a damaged or foreign checkpoint raises becomes a CheckpointError naming it."""
    try:
        yield state.get("identity", {}), checkpoint_spec(state)
    except checkpoint.CheckpointError:
        raise
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise checkpoint.CheckpointError(f"{state.get('path')}: cannot rebuild its network ({e})") from None


def blank(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``build()``'s network on the CPU, its tensors allocated but not initialised: for a checkpoint's weights.
    Built on the meta device, so that its init draws nothing: torch's init draws from the global generator, which
    training's acting shares, and a network rebuilt for a video during training would move training's stream."""
    with torch.device("meta"):
        net = build()
    return net.to_empty(device="cpu")


def _start_or_resume(trainer_cls: type[Trainer], prepared: Prepared, ranks: Solo) -> tuple[Trainer, dict | None, Path]:
    """The trainer (on ``ranks``' share of the run), seeded from the run's seed or, with ``cfg.resume``, restored
    from its checkpoint (counters, state, generators), with parameters equal on every rank; the checkpoint (None
    for a new run) and its run folder."""
    cfg, spec = prepared.config, prepared.spec
    if ranks.world > 1:
        prepared = for_rank(prepared, ranks.rank, ranks.world, ranks.share(cfg))
    device = resolve_device(prepared.config.pipeline.device)
    seed_generators(cfg.env.seed)  # the trainer's networks start from it; a resume restores them
    resumed = checkpoint.load(cfg.resume) if cfg.resume else None
    if resumed is not None:
        run_dir = checkpoint.run_dir_of(resumed["path"])
    else:
        name = cfg.run_name or (f"{spec.env_id.replace('/', '_').replace(':', '.')}__{prepared.recipe.name}__"
                                f"{cfg.env.seed}__{time.strftime('%Y%m%d-%H%M%S')}")
        run_dir = checkpoint.new_run_dir(cfg.log_dir, name)
    t = trainer_cls(prepared, device, ranks)  # what it builds and restores depends on them (R2D2's replay)
    if resumed is not None:
        if ranks.main:
            print(resume_line(resumed.get("config"), cfg, resumed["path"]), flush=True)
        checkpoint.check_compatible(resumed, t.identity(), needs=t.checkpoint_parts)
        t.counters.update(resumed["counters"])
        try:
            t.restore(resumed)
            restore_generators(resumed.get("rng"))
        except torch.OutOfMemoryError:
            raise  # the machine's limit, not the checkpoint's fault
        except (KeyError, ValueError, TypeError, RuntimeError) as e:  # what a part that does not fit raises
            raise checkpoint.CheckpointError(f"{resumed['path']}: cannot be resumed with this configuration "
                                             f"({type(e).__name__}: {e})") from None
    if ranks.rank:  # each rank samples its own actions (rank 0's parameters come by broadcast)
        seed_generators(stream_seed(cfg.env.seed, ranks.rank, "process", t.counters[t.x_axis]))
    t.join_ranks(ranks)
    return t, resumed, run_dir


def _open_monitor(t: Trainer, cfg, run_dir: Path, resumed: dict | None) -> RunMonitor:
    """The run's TensorBoard writer (a resume's purges the points after its checkpoint's) with the config as
    text, and with ``--track`` its W&B run (``tracking.py``), which gets every scalar the writer gets."""
    monitor = RunMonitor(run_dir, purge_step=t.counters[t.x_axis] + 1 if resumed else None, progress=cfg.progress)
    config = dataclasses.asdict(cfg)
    monitor.text("config", "```\n" + json.dumps(config, indent=2) + "\n```", t.counters[t.x_axis])
    if cfg.track:
        from seedlocal.tracking import Tracker

        try:
            monitor.tracker = Tracker(run_dir, config, cfg.wandb_project_name, cfg.wandb_entity, t.x_axis)
        except BaseException:
            monitor.close(failed=True)
            raise
    return monitor


class _Quiet(nullcontext):
    """A data-parallel rank other than 0's monitor: it writes no TensorBoard scalars or text (rank 0 writes the
    run's, with every rank's counts reduced into them) and shows no progress line."""

    scalars = text = progress = lambda self, *args: None  # noqa: E731


def run(trainer_cls: type[Trainer], prepared: Prepared, from_checkpoint: Callable) -> dict:
    """Train the ``prepared`` run until a budget ends; returns the summary (also on Ctrl-C, re-raised after
    saving). ``from_checkpoint``: the family's (``families.Family``), which plays the videos."""
    cfg = prepared.config
    if cfg.pipeline.num_workers > 0:
        start_server(prepared.spec)  # the config and env are valid: a process may start, beside the learner's
    ranks = join(cfg, resolve_device(cfg.pipeline.device).type)  # Solo for one process: no torch.distributed call
    try:
        t, resumed, run_dir = _start_or_resume(trainer_cls, prepared, ranks)
        policy = t.policy()
        if ranks.main:
            checkpoint.make_run_dir(run_dir)
            monitor = _open_monitor(t, cfg, run_dir, resumed)  # nothing that can fail before _loop's with closes it
            if resumed is not None and (aside := checkpoint.set_aside_later(run_dir, resumed["path"])):
                print(aside, flush=True)
            shares = f", {ranks.world} data-parallel learner ranks (each {t.shape.describe_rank()})" \
                if ranks.world > 1 else ""
            # the run's own folder's parent: a resumed run's saved log_dir may be relative to another folder
            print(f"seedlocal: {t.describe()}{shares}; TensorBoard: tensorboard --logdir "
                  f"{shlex.quote(str(Path(run_dir).parent))} (run {run_dir})", flush=True)
            if monitor.tracker is not None:
                print(f"seedlocal: {monitor.tracker.where()}", flush=True)
        else:
            monitor = _Quiet()
        summary = _loop(t, cfg, policy, monitor, run_dir, resumed, from_checkpoint)
    finally:
        ranks.close()
    if ranks.main:
        outcome, nothing = t.outcome(summary)
        print(closing_line(summary, outcome, nothing, go_on=larger_budget(cfg, summary.get("stopped_by"))), flush=True)
    return summary


ENV_ERRORS = "env_errors.log"  # in the run folder: every env worker's traceback, whole


def _loop(t: Trainer, cfg, policy, monitor, run_dir: Path, resumed: dict | None, from_checkpoint: Callable) -> dict:
    """The pipeline, the trainer's updates until a budget ends, and however it ends, the last writes (rank 0's)."""
    summary = monitor.summary = {"status": "done", "run_dir": str(run_dir)}
    torch.set_num_threads(t.learner_threads())
    # A rank's env seeds are its own by its shape (``PipelineShape.seed_block``).
    with monitor, Pipeline(t.cfg.env, t.cfg.pipeline, lambda s, d: policy, t.spec, t.shape, consume=t.consume,
                           bridge=t.cfg.bridge, errors_file=str(run_dir / ENV_ERRORS)) as pipe, \
            TrainingVideos(t, cfg, monitor, from_checkpoint) as videos:
        r = Run(t, pipe, monitor, run_dir, summary, saved_cfg=cfg)
        if pipe.pool.bridge_port is not None:
            print(bridge_line(t.cfg.bridge.listen, pipe.pool.bridge_port, pipe.pool.num_remote_groups,
                              pipe.pool.envs_per_group), flush=True)
        r.runner.start()
        failure = None
        try:
            t.start(r)
            while (stop := t.spent(r)) is None and (stop := t.advance(r)) is None:
                now = time.monotonic()
                if t.log_due(r, now):
                    r.watch.poll()  # names a worker stuck while the others keep the run going
                    r.no_host_yet(now)
                    t.log(r, now)
                    r.logged_at = now
                if t.save_due(r, now) and t.ranks.main:
                    r.save()
                videos.maybe(now, t)
            summary["stopped_by"] = stop
        except BaseException as e:
            summary["status"] = "interrupted" if isinstance(e, KeyboardInterrupt | SystemExit) else "error"
            failure = e
            raise
        finally:
            try:
                t.stop(r)
            finally:
                r.runner.stop()
                t.settle(r)
                _finish(r, failure, resumed)
    return summary


def bridge_line(listen: str, port: int, groups: int, envs_per_group: int) -> str:
    """Where the bridge listens (its port, which ``:0`` leaves to the system) and how an actor host joins."""
    host, _ = split_address("bridge.listen", listen, listen=True)
    wildcard = host in ("0.0.0.0", "::")
    host = f"[{host}]" if ":" in host else host
    return (f"seedlocal: bridge listening on {host}:{port} for {groups * envs_per_group} remote envs ({groups} "
            f"groups); an actor host joins with: seedlocal actors --connect "
            f"{'<this machine' + chr(39) + 's address>' if wildcard else host}:{port}")


def _finish(r: Run, failure, resumed) -> None:
    """The last scalars, checkpoint and summary.json: rank 0's; another rank only fills its summary."""
    t, run_dir, summary = r.trainer, r.run_dir, r.summary
    results = lambda: {"algo": t.algo, "env": t.spec.env_id, **t.results(r),  # noqa: E731
                       "seconds": round(r.elapsed(), 2),
                       "checkpoint": checkpoint.newest(run_dir) if t.ranks.main else None}
    if not t.ranks.main:
        summary.update(results())
        return
    checkpoint.finish_run(
        run_dir, summary, failure,
        last_log=(lambda: t.log(r, time.monotonic(), last=True)) if t.has_last_log() else None,
        # A run that did nothing leaves no checkpoint, so its name can be reused.
        save=r.save if t.counters[t.x_axis] or resumed is not None else None, results=results)


def larger_budget(cfg, stopped_by: str | None) -> str:
    """The option a resume of a run that spent its budget (``stopped_by``: a unit of ``cfg.budgets``, which a
    resumed run counts from its start) needs to go on: that budget, doubled. A time budget counts each session's
    own seconds, so a resume with the same one goes on."""
    for name, _, unit in cfg.budgets:
        if unit == stopped_by and getattr(cfg, name):
            return f" --{name.replace('_', '-')} {2 * getattr(cfg, name)}"
    return ""


def mean_of(recent: deque) -> float | None:
    return float(np.mean(recent)) if recent else None
