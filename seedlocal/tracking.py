"""Weights & Biases tracking (``--track``), as CleanRL's ``--track`` does it: one W&B run per seedlocal run, fed
the config, every scalar ``RunMonitor`` writes, the training videos and summary.json (docs/tracking.md says what
is sent, how a resume continues the run, and offline use). The x axis is the run's own counter (``steps``, or
``generation``), declared as every metric's step (``define_metric``), so W&B's internal step never has to match
it. wandb is an optional extra; ``config/checks.py`` refuses ``--track`` without it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import string
import threading
from pathlib import Path

from seedlocal.errors import ConfigError


def run_id(run_dir: Path) -> tuple[str, bool]:
    """The W&B run id of ``run_dir`` (kept in its ``wandb_run_id`` file), and whether it was there already
    (a resumed run continues it); a new one is made and written otherwise."""
    path = Path(run_dir) / "wandb_run_id"
    saved = path.read_text().strip() if path.exists() else ""
    if saved:
        return saved, True
    new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # as W&B's own ids
    path.write_text(new + "\n")
    return new, False


class Tracker:
    """One W&B run, fed by ``RunMonitor`` (scalars), the training videos (from their own thread: every call
    into the run holds one lock, only while it hands its data over) and the run's end (``finish``)."""

    def __init__(self, run_dir: Path, config: dict, project: str, entity: str, x_axis: str):
        import wandb

        self._wandb, self.x_axis, self._lock = wandb, x_axis, threading.Lock()
        rid, self.resumed = run_id(run_dir)
        try:
            self.run = wandb.init(project=project, entity=entity or None, name=Path(run_dir).name, id=rid,
                                  resume="allow" if self.resumed else None, config=config, dir=str(run_dir),
                                  settings=wandb.Settings(console="off", quiet=True, silent=True))
        except wandb.errors.Error as e:  # no API key (a batch job never logged in), a refused login: W&B's reason
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            wandb.teardown()  # its settings, read at the first init, would refuse a next run in this process
            raise ConfigError(f"track=True: W&B did not start the run: {reason} (or WANDB_MODE=offline to keep "
                              "it here and upload it later with wandb sync)") from None
        self.run.define_metric(x_axis)
        self.run.define_metric("*", step_metric=x_axis)

    def where(self) -> str:
        """Where the run's W&B data goes, for the run's first lines."""
        how = "continues W&B run" if self.resumed else "W&B run"
        if self.run.settings.mode in ("offline", "dryrun") or os.environ.get("WANDB_MODE") in ("offline", "dryrun"):
            folder = Path(self.run.dir).parent
            return f"{how} {self.run.id} offline in {folder}; upload it with: wandb sync {folder}"
        return f"{how} {self.run.id}: {self.run.url}"

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with self._lock:
            self.run.log({**{k: v for k, v in values.items() if v is not None}, self.x_axis: step})

    def video(self, tag: str, gif_path: Path, step: int) -> None:
        # Made before the lock: W&B's media object reads and hashes the whole file, here on the video thread at
        # nice 19, which a loaded machine may not schedule for a while, with the learner's next log waiting.
        media = self._wandb.Video(str(gif_path), format="gif")
        with self._lock:
            self.run.log({tag: media, self.x_axis: step})

    def finish(self, failed: bool, summary: dict | None = None) -> None:
        """Hand over the run's ``summary`` (summary.json's dict), then end the W&B run (exit code 1 when the run
        stopped on an error or Ctrl-C) and its service process, whatever failed before."""
        with self._lock, contextlib.ExitStack() as last:  # finish, then teardown: each runs whatever failed before
            last.callback(self._wandb.teardown)
            last.callback(self.run.finish, exit_code=1 if failed else 0)
            if summary:
                self.run.summary.update({k: v for k, v in summary.items() if v is not None})
