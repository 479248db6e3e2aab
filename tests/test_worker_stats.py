import time

import numpy as np

from seedlocal.pipeline.actors import ActorPool
from seedlocal.shm.slots import create_control


def _pool(control, groups):
    pool = object.__new__(ActorPool)  # worker_stats reads only these: no processes
    pool.control, pool.num_local_groups = control, groups
    return pool


def test_wait_ending_during_read_is_not_counted_from_zero():
    """A group's wait ends (the worker zeroes group_wait_since, then adds the
    wait to group_wait_s) while worker_stats reads: wait_s stays that wait's
    length, never perf_counter() itself."""
    control = create_control(2)
    try:
        shared = control["group_wait_since"]
        shared[0] = time.perf_counter() - 0.5  # group 0 has waited half a second

        class EndsOnCompare(np.ndarray):  # the worker runs between worker_stats' reads
            def __gt__(self, other):
                mask = np.asarray(self) > other
                shared[0] = 0.0
                control["group_wait_s"][0] += 0.5
                return mask

        arrays = dict(control.arrays, group_wait_since=shared.view(EndsOnCompare))
        stats = _pool(arrays, 2).worker_stats()
        assert 0.4 < stats["wait_s"] < 0.6, stats  # once: not 0 (lost), 1.0 (twice) or the uptime
    finally:
        control.close()
