"""TensorBoard scalars and the one-line terminal progress display.

Metric names are part of the interface; this list is where they are defined. The x axis of every scalar is the
agent step count (env.step calls).

charts/episode_return     mean raw return of episodes finished since the last log
charts/episode_length     their mean length, in steps
charts/return_mean20      mean raw return of the last 20 episodes (what --stop-at-return tests)
charts/episodes           episodes finished so far
charts/steps_per_s        agent steps per second since the last log
charts/frames_per_s       emulator frames per second (steps x frame skip)
charts/learning_rate      current learning rate
charts/replay_ratio       learner rows consumed per env step (the data echo: algo.echo passes give ~echo)
losses/policy_loss, losses/baseline_loss, losses/entropy, losses/total_loss   (means over the updates)
losses/clip_fraction      share of rows whose ratio pi/mu left [1 - clip, 1 + clip] (only with algo.clip > 0)
losses/grad_norm          global gradient norm before clipping
losses/mean_rho           mean clipped importance weight (1 = on-policy)
  measured on one update per logging interval:
losses/update_ratio       median over weight tensors of |w_new - w_old| / |w_old| (healthy ~1e-4..1e-2;
                          far below 1e-4 means the optimiser barely moves the network)
update_ratio/<parameter>  the same ratio for each weight tensor
losses/advantage_std      standard deviation of the policy-gradient advantages
losses/value_error        mean |vs - V(x)|: V-trace target vs value head
losses/explained_variance 1 - Var(vs - V) / Var(vs) (1 = the value head predicts the targets; <= 0 = not at all)
perf/inference_batch_size mean envs per inference batch
perf/inference_forward_ms mean policy forward (+ copies) per batch
perf/batch_collect_ms     median time the inference loop waited to fill a batch
perf/worker_wait_share    share of env-group time spent waiting for actions
perf/worker_env_share     share of env-group time spent stepping environments
perf/learner_wait_share   share of learner time spent waiting for unrolls
perf/policy_lag           parameter updates between acting and learning (averaged over a batch's updates)
perf/worker_restarts      env workers restarted so far (every trainer logs it; a worker may restart
                          pipeline.max_restarts times within pipeline.restart_window_s)

Neuroevolution (``train ga|es|random-search``) logs once per generation, with the generation number as the x axis:

charts/best_fitness, charts/mean_fitness, charts/median_fitness   over the population
charts/best_member_return the elite's / ES centre's / best member's mean return on fresh episodes
charts/episodes, charts/frames   totals over whole generations (frames: evaluation episodes only); a
                          resumed run counts on from its checkpoint's, its last whole generation
perf/frames_per_generation, perf/frames_per_s, perf/generation_s
perf/idle_share           share of stepped env slots that played no evaluation episode
                          (idle while a generation's last episodes finish, auto-reset steps)
perf/env_time_s, perf/inference_time_s   time in env stepping (per group) and in forward passes
perf/capped_share         share of the generation's evaluation episodes ended by --max-episode-frames
perf/worker_restarts      env workers restarted so far

summary.json's frames (and steps, episodes) add those of a generation the run stopped inside, which its
checkpoint does not hold (the README's "Neuroevolution" says what its progress line shows meanwhile).

R2D2 (``train r2d2``) logs, against agent steps: charts/episode_return, charts/eval_return (the evaluation slots'
return, epsilon ``eval_epsilon``), charts/episodes, charts/steps_per_s, charts/frames_per_s, charts/replay_ratio;
losses/loss, losses/grad_norm, losses/td_abs (mean |TD error|), losses/q_mean; replay/size, replay/insert_per_s,
replay/sample_per_s, replay/priority_mean, replay/priority_max, replay/stale_updates_dropped; perf/updates_per_s,
perf/worker_restarts.

With a bridge (``--bridge.listen``), every trainer adds bridge/hosts_connected, bridge/disconnects and per actor
host bridge/host<N>/steps_per_s, mb_per_s, rtt_ms_p50, rtt_ms_p99.

With ``--video-every-min M`` every trainer adds videos/episode, an animated GIF under Images; with ``--track``
every scalar above goes to Weights & Biases under the same name (docs/tracking.md says both).

Every ``train`` command also writes ``<run>/summary.json`` when it ends (budget, target, Ctrl-C or error): algo,
env, steps, frames, seconds, the return (``mean_return_last20``; ``best_member_return`` for neuroevolution),
``steps_to_target``/``frames_to_target`` (null unless --stop-at-return was reached; V-trace, R2D2 and populations
add ``return_at_target``, the 20-episode mean that met it: episodes that end while the run stops can leave the
final mean below), the checkpoint path and ``status`` (done, interrupted, error).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import time
from pathlib import Path

from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard import SummaryWriter

from seedlocal.checkpoint import lock_run
from seedlocal.errors import ConfigError


_BUDGETS = {"steps": "step budget spent", "frames": "frame budget spent", "seconds": "time budget spent",
            "generations": "all generations run"}


def nothing_stepped(cfg) -> str:
    """The closing line's head for a run whose budget ended before any env step."""
    if cfg.bridge.listen and not cfg.pipeline.num_workers:
        return f"stopped before the first env step (no actor host connected to {cfg.bridge.listen})"
    return "stopped before the first env step (the budget ended during start-up)"


def next_commands(algo: str, run_dir, go_on: str = "") -> str:
    """What to type next about a run that has a checkpoint: play it, go on with it (``go_on``: the options
    a resume needs besides the run, e.g. a larger budget), and see its curves."""
    run, log_dir = shlex.quote(str(run_dir)), shlex.quote(str(Path(run_dir).parent))
    return (f"  play it:     seedlocal eval --checkpoint {run}\n"
            f"  go on:       seedlocal train {algo} --resume {run}{go_on}\n"
            f"  its curves:  tensorboard --logdir {log_dir}")


def closing_line(summary: dict, outcome: str, nothing_done: str | None = None, go_on: str = "") -> str:
    """A trainer's last line when its run ends by itself: why it stopped (``summary["stopped_by"]``, or
    ``nothing_done`` when the budget ended before any work), what it reached (``outcome``), and where its
    checkpoint and summary are; then, with a checkpoint, the commands that go on from it (``next_commands``)."""
    by = summary.get("stopped_by")
    if nothing_done:
        head = nothing_done
    elif by == "target":
        at = summary.get("return_at_target")
        head = (f"done: reached the target return{'' if at is None else f' (mean {at:.1f} over 20 episodes)'} at "
                f"{summary['frames_to_target']:,d} frames")
    else:
        head = "done: " + _BUDGETS.get(by, "stopped")
    where = summary.get("checkpoint") or "none (nothing was trained)"
    line = f"\nseedlocal: {head}; {outcome}; checkpoint {where}; summary {Path(summary['run_dir']) / 'summary.json'}"
    if summary.get("checkpoint") and summary.get("algo"):
        line += "\n" + next_commands(summary["algo"], summary["run_dir"], go_on)
    return line


def _after_older_event_files(older: set[Path]) -> None:
    """Wait, at most a second, until a new event file's name sorts after the run's ``older`` ones.

    TensorBoard reads a run's files in name order. A name holds the second it was made in, then a
    per-process counter that sorts as text (".10" before ".9"): a resume's file made in the same second
    as the run's last one could be read first, and the older steps after it then purge the resume's."""
    seconds = [int(m.group(1)) for p in older if (m := re.match(r"events\.out\.tfevents\.(\d+)\.", p.name))]
    if seconds:  # a file from the future (another machine's clock) is not waited for past a second
        until = min(max(seconds) + 1, time.time() + 1)
        while time.time() < until:
            time.sleep(max(0.01, until - time.time()))


class RunMonitor(contextlib.AbstractContextManager):
    def __init__(self, run_dir: Path, purge_step: int | None = None, progress: bool = True, lock: bool = True):
        """``lock``: hold the run folder for this process (a trainer; eval's video only adds an image to a run,
        maybe one still training).

        ``tracker`` (a ``tracking.Tracker``, set by the run with ``--track``) gets every scalar written here, and
        at ``close`` the run's ``summary`` (the dict summary.json is written from) and its end."""
        self.run_dir = Path(run_dir)
        self._lock = lock_run(self.run_dir) if lock else None
        self._new_run = lock and purge_step is None  # a trainer's new run, not a resume or a video
        self._older = set(self.run_dir.glob("events.out.tfevents.*"))
        if self._new_run and self._older:
            # A run of this name died before its first checkpoint (a new run is refused where one exists): its
            # points would mix with this run's curve. Purged from step 0 on, TensorBoard shows this run's only.
            purge_step = 0
            print(f"seedlocal: {self.run_dir} holds the TensorBoard files of a run that saved no checkpoint; this "
                  "run's curve replaces its points (its files are kept)", flush=True)
        _after_older_event_files(self._older)
        self.writer = SummaryWriter(str(self.run_dir), purge_step=purge_step)
        self._wrote_scalars = False
        self.progress_enabled = progress
        self._tty = sys.stderr.isatty()
        self._last_line = 0.0
        self.tracker = None
        self.summary: dict | None = None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._wrote_scalars = True
        for tag, v in values.items():
            if v is not None:
                self.writer.add_scalar(tag, v, step)
        if self.tracker is not None:
            self.tracker.scalars(step, values)

    def text(self, tag: str, value: str, step: int = 0) -> None:
        self.writer.add_text(tag, value, step)

    def image_summary(self, tag: str, encoded: bytes, height: int, width: int, step: int) -> None:
        """An already-encoded image (PNG, or an animated GIF, which TensorBoard plays)."""
        img = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=encoded)
        self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=img)]), step)

    def progress(self, line: str) -> None:
        """One live line on a terminal; a plain line every 10 s in a log file."""
        if not self.progress_enabled:
            return
        now = time.monotonic()
        if self._tty:
            print("\r" + line[:160].ljust(100), end="", file=sys.stderr, flush=True)
        elif now - self._last_line >= 10.0:
            print(line, file=sys.stderr, flush=True)
            self._last_line = now

    def close(self, failed: bool = False) -> None:
        if self.writer is None:
            return
        tracker, self.tracker = self.tracker, None
        try:
            if tracker is not None:
                tracker.finish(failed or (self.summary or {}).get("status", "done") != "done", self.summary)
        finally:
            if self._tty and self.progress_enabled:
                sys.stderr.write("\n")
            try:
                self.writer.close()  # flushes first
            finally:
                self.writer = None
                if self._lock is not None:
                    self._lock.close()

    def __exit__(self, kind, exc, tb) -> None:
        """Closes the run (its lock too). An exception leaving the run, Ctrl-C included, carries the run folder for
        the CLI's last line."""
        if exc is not None and getattr(exc, "seedlocal_run_dir", None) is None:
            exc.seedlocal_run_dir = self.run_dir
        self.close(failed=exc is not None)
        if not (isinstance(exc, ConfigError) and self._new_run and not self._wrote_scalars):
            return
        # A new run refused before it began (e.g. sizes that do not fit in memory) leaves no folder: it would hold
        # only its lock and an events file with the config text, and show in TensorBoard as a run.
        files = [f for f in self.run_dir.iterdir() if f not in self._older]  # an earlier dead run's are kept
        if all(f.is_file() and (f.name == ".lock" or f.name.startswith("events.out.tfevents")) for f in files):
            for f in files:
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()
