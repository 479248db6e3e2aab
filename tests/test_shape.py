"""The pipeline's shape: derived once (seedlocal/shape.py), checked there, and nowhere else."""

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from seedlocal.config.schema import BridgeConfig, PipelineConfig
from seedlocal.errors import ConfigError
from seedlocal.shape import ShapeNeeds, actor_host_shape, pipeline_shape

ROOT = Path(__file__).resolve().parents[1] / "seedlocal"
SHAPE = ROOT / "shape.py"


# -- the builder ---------------------------------------------------------------------


def test_sizes_of_a_local_run():
    s = pipeline_shape(PipelineConfig(num_workers=2, envs_per_worker=32, unroll_length=16, env_threads=8))
    assert (s.num_workers, s.envs_per_group, s.num_local_groups, s.num_remote_groups) == (2, 16, 4, 0)
    assert (s.num_groups, s.num_envs, s.num_local_envs, s.envs_per_worker) == (4, 64, 64, 32)
    assert s.unroll_length == 16
    assert s.num_buffers == 3 * 4  # no trainer's needs: three per group
    assert s.min_batch_envs == 32  # half of all envs: one group per worker
    assert s.threads_per_group == 2  # 8 threads over 4 groups
    assert s.unrolls_per_batch == 0
    assert list(s.groups_of(1)) == [2, 3] and s.worker_of(3) == 1


def test_explicit_values_are_kept():
    s = pipeline_shape(PipelineConfig(num_workers=1, envs_per_worker=8, num_buffers=5, min_batch_envs=2))
    assert (s.num_buffers, s.min_batch_envs) == (5, 2)


def test_a_batch_of_whole_groups_sets_k_and_the_buffers():
    """V-trace: k = batch / envs per group unrolls; one buffer per group and at least a batch."""
    p = PipelineConfig(num_workers=2, envs_per_worker=8)  # 4 groups of 4
    v = ShapeNeeds(batch_envs=8, buffers_per_group=1)
    assert (pipeline_shape(p, needs=v).unrolls_per_batch, pipeline_shape(p, needs=v).num_buffers) == (2, 4)
    big = pipeline_shape(p, needs=dataclasses.replace(v, batch_envs=24))
    assert (big.unrolls_per_batch, big.num_buffers) == (6, 6)


def test_the_learners_own_unroll_length():
    """R2D2: pipeline.unroll_length 0 takes the learner's; two buffers per group."""
    s = pipeline_shape(PipelineConfig(num_workers=1, envs_per_worker=4, unroll_length=0),
                       needs=ShapeNeeds(unroll_length=10, buffers_per_group=2))
    assert (s.unroll_length, s.num_buffers) == (10, 4)


def test_bridge_remote_groups_follow_the_local_ones():
    p = PipelineConfig(num_workers=1, envs_per_worker=8)
    s = pipeline_shape(p, BridgeConfig(listen="127.0.0.1:0", remote_envs=16))
    assert (s.num_local_groups, s.num_remote_groups, s.num_groups) == (2, 4, 6)
    assert (s.num_envs, s.num_local_envs, s.min_batch_envs, s.num_buffers) == (24, 8, 12, 18)
    assert pipeline_shape(p, BridgeConfig(remote_envs=16)).num_remote_groups == 0  # not listening: no remote envs
    remote_only = pipeline_shape(dataclasses.replace(p, num_workers=0), BridgeConfig(listen=":0", remote_envs=8))
    assert (remote_only.num_local_groups, remote_only.num_remote_groups) == (0, 2)


def test_an_actor_hosts_shape_is_its_assignment():
    s = actor_host_shape(groups=4, envs_per_group=3, env_threads=4)
    assert (s.num_workers, s.num_groups, s.envs_per_group, s.num_buffers, s.unroll_length) == (2, 4, 3, 4, 1)
    assert s.threads_per_group == 1
    assert [s.whole_workers(n) for n in range(5)] == [0, 0, 2, 2, 4]


def test_the_shape_is_frozen():
    s = pipeline_shape(PipelineConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.envs_per_group = 3


@pytest.mark.parametrize("pipe, bridge, needs, prefix, message", [
    (dict(num_workers=0), None, None, "pipeline",
     "pipeline.num_workers=0: must be positive (or 0 with bridge.remote_envs)"),
    (dict(envs_per_worker=-4), None, None, "pipeline", "pipeline.envs_per_worker=-4: must be positive"),
    (dict(envs_per_worker=7), None, None, "pipeline",
     "pipeline.envs_per_worker=7: must be even: each worker steps two equal groups"),
    (dict(envs_per_worker=3), None, None, "bench", "bench.envs_per_worker=3: must be even"),
    (dict(unroll_length=0), None, None, "pipeline", "pipeline.unroll_length=0: must be positive"),
    (dict(unroll_length=-1), None, ShapeNeeds(unroll_length=10), "pipeline",
     "pipeline.unroll_length=-1: must be positive"),
    (dict(min_batch_envs=-1), None, None, "pipeline", "pipeline.min_batch_envs=-1: must be 0 (automatic) or positive"),
    (dict(num_buffers=3), None, None, "pipeline",
     r"pipeline.num_buffers=3: needs at least one unroll per group (4)"),
    (dict(envs_per_worker=8, num_buffers=4), None, ShapeNeeds(batch_envs=20), "pipeline",
     "pipeline.num_buffers=4: needs one unroll per group (4) and at least a batch (5)"),
    (dict(envs_per_worker=8), None, ShapeNeeds(batch_envs=6), "pipeline",
     "algo.batch_size=6: must be a positive multiple of the envs per group (4, half of "
     "pipeline.envs_per_worker=8): change one or the other"),
    (dict(envs_per_worker=8), None, ShapeNeeds(batch_envs=0), "pipeline", "algo.batch_size=0: must be a positive"),
    (dict(envs_per_worker=8), dict(listen="127.0.0.1:0", remote_envs=6), None, "pipeline",
     "bridge.remote_envs=6: must be a positive multiple of pipeline.envs_per_worker (8): actor hosts run whole "
     "workers of two groups"),
    (dict(envs_per_worker=8), dict(listen="127.0.0.1:0", remote_envs=0), None, "pipeline",
     "bridge.remote_envs=0: must be a positive multiple"),
])
def test_refusals_are_one_line_naming_the_field(pipe, bridge, needs, prefix, message):
    with pytest.raises(ConfigError) as e:
        pipeline_shape(PipelineConfig(**pipe), BridgeConfig(**bridge) if bridge else None, needs or ShapeNeeds(),
                       prefix=prefix)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_each_trainer_declares_what_it_needs():
    """The defaults each trainer chose for itself before the shape existed: V-trace one unroll per group and at
    least a batch, R2D2 two per group of its own unroll length, neuroevolution three per group."""
    from seedlocal.families import recipe

    vtrace, r2d2 = recipe("vtrace"), recipe("r2d2")
    for cfg in (vtrace.run(), vtrace.presets["atari"]):
        s = pipeline_shape(cfg.pipeline, cfg.bridge, vtrace.needs(cfg))
        k = cfg.algo.batch_size // s.envs_per_group
        assert (s.unrolls_per_batch, s.num_buffers) == (k, max(s.num_groups, k))
    cfg = r2d2.run()
    s = pipeline_shape(cfg.pipeline, cfg.bridge, r2d2.needs(cfg))
    assert (s.unroll_length, s.num_buffers) == (cfg.algo.unroll_length, 2 * s.num_groups)
    assert recipe("ga").needs(cfg) == ShapeNeeds()


# -- nowhere else ----------------------------------------------------------------------

HALF = {"2", "GROUPS_PER_WORKER"}  # a worker's two groups
SIZED = re.compile(r"envs|per_worker|group|\bE\b|\bG\b", re.I)  # env and group counts
WORKERS = re.compile(r"num_workers|\bworkers\b")
# ``// 2`` that is not the pipeline's shape, each with its reason.
OTHER_HALVES = {
    ("algos/es.py", "p.population_size // 2"),  # antithetic pairs
    ("arithmetic.py", "len(times) // 2"),  # a median
    ("trainers/evolvers.py", "len(row) // 2"),  # a rank's gathered fitness, then its returns
    ("measure/raw.py", "n // 2"),  # raw envpool's half pools: the baseline, not the pipeline
    ("measure/raw.py", "threads // 2"),
    ("pipeline/bridge/client.py", "len(reason) // 2"),  # a refusal's text cut to fit the handshake's bytes
    ("algos/pbt.py", "n // 2"),  # PBT's quantiles: at most half the members
}


def _shape_formulas(source: str, rel: str) -> list[str]:
    """Where ``source`` (module ``rel``) computes a group's size, a number of groups, or a worker's envs."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("num_groups", "threads_per_group"):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)} (a group count of its own)")
        if not isinstance(node, ast.BinOp):
            continue
        left, right, op, text = ast.unparse(node.left), ast.unparse(node.right), type(node.op), ast.unparse(node)
        where = f"{rel}:{node.lineno}: {text}"
        if op in (ast.FloorDiv, ast.Div):
            if "envs_per_worker" in left:
                found.append(f"{where} (envs_per_worker divided: the group size)")
            elif right in HALF and SIZED.search(left):
                found.append(f"{where} (half of envs or groups)")
            elif op is ast.FloorDiv and right in HALF and (rel, text) not in OTHER_HALVES:
                found.append(f"{where} (a half: if it is not the shape's, add it to OTHER_HALVES with its reason)")
            elif "remote_envs" in left or ("envs" in left and SIZED.search(right)):
                found.append(f"{where} (a number of groups)")
        elif op is ast.Mult:
            for half, other in ((left, right), (right, left)):
                if half in HALF and (WORKERS.search(other) or SIZED.search(other)):
                    found.append(f"{where} (groups of workers, or a worker's envs)")
    return found


def test_the_shape_is_computed_only_in_its_builder():
    """``envs_per_worker // 2``, halves of env counts and group counts appear in seedlocal/shape.py only;
    every other module takes them from a PipelineShape."""
    found = [f for path in sorted(ROOT.rglob("*.py")) if path != SHAPE
             for f in _shape_formulas(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, "\n".join(found)


def test_the_checker_sees_the_formulas_it_forbids():
    """The shapes of code the check above must catch (all of them were in seedlocal/ before the shape)."""
    code = ("group = p.envs_per_worker // 2\n"
            "groups = 2 * p.num_workers + remote // max(1, p.envs_per_worker // GROUPS_PER_WORKER)\n"
            "n = self.bridge.remote_envs // layout.envs\n"
            "m = (pipe.num_workers * pipe.envs_per_worker + remote) // 2\n"
            "w, e = G // 2, 2 * E\n"
            "x = num_groups(cfg.pipeline, cfg.bridge)\n"
            "free = free[: (len(free) // 2) * 2]\n")
    found = _shape_formulas(code, "probe.py")
    assert {int(f.split(":")[1]) for f in found} == set(range(1, 8)), "\n".join(found)


def test_on_a_runs_path_only_the_builder_reads_envs_per_worker():
    """The walk of pipeline.envs_per_worker from the command line to envpool (docs/architecture.md):
    config/schema.py (envs_per_worker) -> shape.py (envs_per_group) -> pipeline/actors.py -> pipeline/worker.py ->
    envs/make.py -> envs/envpool_group.py (envpool's num_envs), under two names."""
    readers = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "envs_per_worker" and isinstance(node.ctx, ast.Load):
                readers.add(path.relative_to(ROOT).as_posix())
    # The actor host's own option (bridge/client.py), the shape's envs_per_worker that the bridge server asks
    # actor hosts for, and the bench's options, from which it makes a PipelineConfig.
    assert readers <= {"shape.py", "pipeline/bridge/client.py", "pipeline/bridge/server.py", "measure/__init__.py",
                       "measure/bench.py", "measure/autotune.py"}, readers

    from seedlocal.pipeline.actors import ActorPool
    from seedlocal.envs.envpool_group import EnvpoolGroup
    from seedlocal.envs.make import make_group
    from seedlocal.pipeline.worker import WorkerArgs
    from seedlocal.shape import PipelineShape

    assert "envs_per_group" in {f.name for f in dataclasses.fields(PipelineShape)}
    assert "shape" in inspect.signature(ActorPool).parameters
    assert "envs_per_group" in {f.name for f in dataclasses.fields(WorkerArgs)}
    assert "envs_per_group" in inspect.signature(make_group).parameters
    assert "envs_per_group" in inspect.signature(EnvpoolGroup).parameters


# -- a learner rank's: the run's divided (issue 44) ----------------------------------------------------------


def test_a_learner_ranks_shape_is_the_runs_divided():
    """Each rank kept the run's min_batch_envs over its 1/G of the workers, rounded up: R2D2's Atari preset sized
    for 16 cores (8 workers of 16, min batch 64) gave 64 envs a rank waiting for 64 at G=2, and 32 envs waiting
    for 64 at G=4, so that every batch waited for every group; MinAtar's (2 workers of 16) at G=4 ran 4 x 16
    envs, twice the run's 32. A rank's shape, as its trainer builds it from its config, is the run's divided: the
    ranks together step the run's envs, and each waits for its share of the run's min batch, no more than half of
    its envs (a worker's other group steps meanwhile)."""
    from seedlocal.config.machine import Machine
    from seedlocal.config.request import Request
    from seedlocal.families import recipe
    from seedlocal.pipeline.ranks import Ranks
    from seedlocal.prepare import for_rank, prepare

    atari = prepare(Request({}, preset="atari"), recipe("r2d2"), Machine(16, True))
    minatar = prepare(Request({}, preset="minatar"), recipe("r2d2"), Machine(2, False))
    for prepared, G, want in [(atari, 2, (4, 16, 64, 32)), (atari, 4, (2, 16, 32, 16)), (minatar, 4, (1, 8, 8, 2))]:
        cfg, run = prepared.config, prepared.shape
        for r in range(G):
            s = for_rank(prepared, r, G, Ranks(r, G, r, 60.0).share(cfg)).shape
            assert (s.num_workers, s.envs_per_worker, s.num_envs, s.min_batch_envs) == want, (cfg.env.id, G)
            assert G * s.num_envs == run.num_envs and G * s.min_batch_envs == run.min_batch_envs
            assert s.min_batch_envs <= s.num_envs // 2 and (s.rank, s.ranks) == (r, G)


def test_fewer_workers_than_ranks_split_their_envs_or_are_refused():
    """CartPole's 2 workers of 8 envs (groups of 4) on 4 ranks: 1 worker of 4 envs each, whose groups of 2 make
    any batch of the run's whole groups whole groups of a rank; min_batch_envs and num_buffers given for the run
    are divided too, and each rank gets its share of env_threads. 16 envs do not divide among 3 ranks: refused in
    one line naming the field."""
    p = PipelineConfig(num_workers=2, envs_per_worker=8, min_batch_envs=4, num_buffers=8, env_threads=8)
    s = pipeline_shape(p, needs=ShapeNeeds(batch_envs=4, buffers_per_group=1), rank=3, ranks=4)
    assert (s.num_workers, s.envs_per_worker, s.num_envs, s.min_batch_envs, s.num_buffers) == (1, 4, 4, 1, 2)
    assert (s.unrolls_per_batch, s.threads_per_group, s.rank, s.ranks) == (2, 1, 3, 4)
    with pytest.raises(ConfigError) as e:
        pipeline_shape(p, ranks=3)
    assert str(e.value) == ("pipeline.num_workers=2: 2 workers of 8 envs cannot be divided among 3 learner ranks "
                            "(each takes 1/3 of the envs, in workers whose groups divide the run's groups of 4): "
                            "give a multiple of 3 workers")
    with pytest.raises(ConfigError, match=r"pipeline.num_buffers=2: needs at least one unroll per group \(2\) \(a "
                                          r"learner rank's share: 1\)"):
        pipeline_shape(dataclasses.replace(p, num_buffers=2), ranks=2)
