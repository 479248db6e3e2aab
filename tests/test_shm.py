import multiprocessing as mp
from contextlib import closing

import numpy as np
import pytest
import torch

from conftest import seedlocal_segments
from seedlocal.shm.arrays import ArraySpec, SharedArrays

SPECS = [ArraySpec("obs", (4, 3, 84, 84), "uint8"), ArraySpec("reward", (4, 3), "float32"),
         ArraySpec("flag", (7,), "bool")]


def _child_writes(handle):
    arrs = SharedArrays.attach(*handle)
    assert arrs["reward"][1, 2] == 5.0  # sees the parent's write
    arrs["obs"][2, 1] = 9
    arrs["flag"][3] = True
    arrs.close()


def test_layout_is_aligned_and_typed():
    with closing(SharedArrays.create(SPECS, "t")) as arrs:
        for s in SPECS:
            a = arrs[s.name]
            assert a.shape == s.shape and a.dtype == np.dtype(s.dtype)
            assert a.ctypes.data % 64 == 0


def test_other_process_attaches_by_name_and_writes_are_shared():
    with closing(SharedArrays.create(SPECS, "t")) as arrs:
        arrs["reward"][1, 2] = 5.0
        p = mp.get_context("spawn").Process(target=_child_writes, args=(arrs.handle(),))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        assert (arrs["obs"][2, 1] == 9).all() and arrs["obs"][2, 0].max() == 0
        assert arrs["flag"][3]


def test_torch_view_is_zero_copy():
    with closing(SharedArrays.create(SPECS, "t")) as arrs:
        t = torch.from_numpy(arrs["reward"])
        t[0, 0] = 3.5
        assert arrs["reward"][0, 0] == 3.5
        del t


def test_owner_unlinks_even_on_exception():
    with pytest.raises(RuntimeError):
        with closing(SharedArrays.create(SPECS, "t")) as arrs:
            name = arrs.name
            assert name in seedlocal_segments()
            raise RuntimeError("boom")
    assert name not in seedlocal_segments()


def test_duplicate_names_refused():
    with pytest.raises(ValueError, match="duplicate"):
        SharedArrays.create([ArraySpec("a", (1,), "int32"), ArraySpec("a", (2,), "int32")], "t")
