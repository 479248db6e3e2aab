"""Weights & Biases tracking (``--track``), as CleanRL's ``--track`` does it.

One W&B run per seedlocal run: the full config at the start, every scalar
``RunMonitor`` writes to TensorBoard under the same name, the training
videos (``--video-every-min``) as they are made, and summary.json's values
at the end. The x axis is the run's own counter (``steps``, or
``generation`` for neuroevolution), logged with every point and declared
as every metric's step (``define_metric``), so W&B's internal step never
has to match it: a resumed run logs steps it had logged before its last
checkpoint again, and W&B keeps both points where TensorBoard purges.

The W&B run's id is kept in the run folder (``wandb_run_id``): ``--resume``
continues the same W&B run. Offline (``WANDB_MODE=offline``, or no
network) the files go under ``<run>/wandb/``, and the first line says so
and how to upload them (``wandb sync``). The service process W&B starts
(wandb-core) ends with the run, not with the interpreter: a notebook
that trains twice holds none between runs.

wandb is an optional extra (``pip install 'seedlocal[wandb]'``); the
config's checks (``config/checks.py``) refuse ``--track`` without it
before any process starts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

ID_FILE = "wandb_run_id"


def run_id(run_dir: Path) -> tuple[str, bool]:
    """The W&B run id of ``run_dir`` (kept in its ``wandb_run_id`` file), and whether it was there already
    (a resumed run continues it); a new one is made and written otherwise."""
    import secrets
    import string

    path = Path(run_dir) / ID_FILE
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
        rid, resumed = run_id(run_dir)
        self.run = wandb.init(project=project, entity=entity or None, name=Path(run_dir).name, id=rid,
                              resume="allow" if resumed else None, config=config, dir=str(run_dir),
                              settings=wandb.Settings(console="off", quiet=True, silent=True))
        self.run.define_metric(x_axis)
        self.run.define_metric("*", step_metric=x_axis)
        self.resumed = resumed

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

    def summary(self, summary: dict) -> None:
        with self._lock:
            self.run.summary.update({k: v for k, v in summary.items() if v is not None})

    def finish(self, failed: bool) -> None:
        """End the W&B run (exit code 1 when the run stopped on an error or Ctrl-C) and its service process."""
        with self._lock:
            try:
                self.run.finish(exit_code=1 if failed else 0)
            finally:
                self._wandb.teardown()
