"""A run's pipeline shape: its groups, envs, unrolls and batches, derived once.

Every size on the data path follows from a few ``pipeline.*`` fields and ``bridge.remote_envs``, and from what
the trainer asks for (``ShapeNeeds``). ``pipeline_shape`` derives them, refuses values that make no shape (one
line naming the field) and freezes them in a ``PipelineShape``. Everything below the trainer takes the shape,
not the config:

    group          envs_per_group = envs_per_worker / 2 envs stepped together; a worker steps two (double
                   buffering: one steps while the other waits for its actions)
    groups         2 per local worker, numbered first; then one per envs_per_group of bridge.remote_envs
    unroll_length  pipeline.unroll_length, or the learner's own (R2D2)
    num_buffers    pipeline.num_buffers, or per group as many as the trainer asks (V-trace 1, R2D2 2, else 3),
                   and at least a batch
    min_batch_envs pipeline.min_batch_envs, or half of all envs (one group per worker: the other half steps)

This module is the only place that computes a group's size or the number of groups (``tests/test_shape.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from seedlocal.config.checks import usable_cores
from seedlocal.config.schema import BridgeConfig, PipelineConfig
from seedlocal.errors import fail, fail_if

GROUPS_PER_WORKER = 2  # double buffering


@dataclass(frozen=True)
class ShapeNeeds:
    """What a trainer asks of the pipeline's shape; the defaults ask nothing."""

    batch_envs: int | None = None
    """envs per learner batch (V-trace's algo.batch_size): whole groups, so a batch is whole unrolls"""
    unroll_length: int | None = None
    """the learner's own unroll length (R2D2's algo.unroll_length), taken where pipeline.unroll_length is 0"""
    buffers_per_group: int = 3
    """unrolls per group where pipeline.num_buffers is 0 (and at least a batch)"""


@dataclass(frozen=True)
class PipelineShape:
    """The sizes of a run's data path (see the module docstring); made by ``pipeline_shape``."""

    num_workers: int
    """local env worker processes"""
    envs_per_group: int
    """envs one group steps together, half of a worker's"""
    num_local_groups: int
    num_remote_groups: int
    """groups stepped by actor hosts through the bridge, numbered after the local ones"""
    unroll_length: int
    """T: steps per unroll (the store keeps T + 1 rows)"""
    num_buffers: int
    """unrolls in the store"""
    min_batch_envs: int
    """ready envs the inference loop waits for"""
    threads_per_group: int
    """envpool threads of each local group"""
    unrolls_per_batch: int = 0
    """k: unrolls per learner batch (0: the trainer takes no batches of whole unrolls)"""
    rank: int = 0
    ranks: int = 1
    """the data-parallel learner ranks the run's shape is divided among, and which of them this is"""

    @property
    def num_groups(self) -> int:
        return self.num_local_groups + self.num_remote_groups

    @property
    def num_envs(self) -> int:
        return self.num_groups * self.envs_per_group

    @property
    def num_local_envs(self) -> int:
        return self.num_local_groups * self.envs_per_group

    @property
    def envs_per_worker(self) -> int:
        return GROUPS_PER_WORKER * self.envs_per_group

    def groups_of(self, worker: int) -> range:
        return range(worker * GROUPS_PER_WORKER, (worker + 1) * GROUPS_PER_WORKER)

    def worker_of(self, group: int) -> int:
        return group // GROUPS_PER_WORKER

    def whole_workers(self, groups: int) -> int:
        """The most of ``groups`` groups that make whole workers (actor hosts run workers like these)."""
        return groups - groups % GROUPS_PER_WORKER

    def seed_block(self, start: int) -> int:
        """Where this rank's envs' seeds begin, counted from env.seed, at their ``start``-th start (a worker's
        restart, an actor host's assignment): one block of ``num_envs`` seeds per start and rank, in that order,
        so that no two ranks or starts of the run share a seed (until the seeds wrap: ``envs/make.py``)."""
        return (start * self.ranks + self.rank) * self.num_envs

    def describe_rank(self) -> str:
        """What one rank steps, for the run's first line."""
        return (f"{self.num_workers} worker{'s' * (self.num_workers != 1)} of {self.envs_per_worker} envs, "
                f"min batch {self.min_batch_envs}")


def worker_groups(num_workers: int) -> int:
    return GROUPS_PER_WORKER * num_workers


def pipeline_shape(p: PipelineConfig, bridge: BridgeConfig | None = None, needs: ShapeNeeds = ShapeNeeds(),
                   prefix: str = "pipeline", rank: int = 0, ranks: int = 1) -> PipelineShape:
    """The shape of a run of ``p``, with ``bridge``'s remote envs where it listens, for a trainer that ``needs``
    it so; with ``ranks`` > 1, learner rank ``rank``'s, the run's divided. A value that makes no shape fails
    here (ConfigError), naming its field as ``prefix``.name."""
    remote_envs = bridge.remote_envs if bridge is not None and bridge.listen else 0
    _check_fields(p, bridge, remote_envs, needs, prefix)
    workers, per_worker = rank_workers(p, ranks, prefix)
    group = per_worker // GROUPS_PER_WORKER
    local, remote = worker_groups(workers), remote_envs // group
    k = 0
    if needs.batch_envs is not None:
        if needs.batch_envs < 1 or needs.batch_envs % group:
            worker = (f"{prefix}.envs_per_worker={p.envs_per_worker}" if per_worker == p.envs_per_worker else
                      f"a learner rank's workers of {per_worker}")
            fail("algo.batch_size", needs.batch_envs, f"must be a positive multiple of the envs per group ({group}, "
                 f"half of {worker}): change one or the other")
        k = needs.batch_envs // group
    groups = local + remote
    buffers = _rank_share(p.num_buffers, ranks)
    each = f" (a learner rank's share: {buffers})" if ranks > 1 else ""
    if buffers and buffers < max(groups, k):
        why = (f"needs at least one unroll per group ({groups})" if buffers < groups else
               f"needs one unroll per group ({groups}) and at least a batch ({k})")
        fail(f"{prefix}.num_buffers", p.num_buffers, why + each)
    return PipelineShape(
        num_workers=workers, envs_per_group=group, num_local_groups=local, num_remote_groups=remote,
        unroll_length=p.unroll_length or needs.unroll_length or 0,
        num_buffers=buffers or max(needs.buffers_per_group * groups, k),
        min_batch_envs=_rank_share(p.min_batch_envs, ranks) or groups * group // 2,
        threads_per_group=_threads_per_group(p, workers, ranks), unrolls_per_batch=k, rank=rank, ranks=ranks)


def _check_fields(p: PipelineConfig, bridge: BridgeConfig | None, remote_envs: int, needs: ShapeNeeds,
                  prefix: str) -> None:
    """The run's own values, each refused in one line naming it (before any is divided among ranks)."""
    if p.num_workers < 1 and not (remote_envs and p.num_workers == 0):  # 0: every env remote
        fail(f"{prefix}.num_workers", p.num_workers, "must be positive (or 0 with bridge.remote_envs)")
    if p.envs_per_worker < 1:
        fail(f"{prefix}.envs_per_worker", p.envs_per_worker, "must be positive")
    if p.unroll_length < 1 and not (needs.unroll_length is not None and p.unroll_length == 0):  # the learner's own
        fail(f"{prefix}.unroll_length", p.unroll_length, "must be positive")
    if p.envs_per_worker % GROUPS_PER_WORKER:
        fail(f"{prefix}.envs_per_worker", p.envs_per_worker, "must be even: each worker steps two equal groups")
    fail_if(lambda v: v < 0, p, ("num_buffers", "min_batch_envs"), "must be 0 (automatic) or positive", f"{prefix}.")
    if bridge is not None and bridge.listen and (remote_envs <= 0 or remote_envs % p.envs_per_worker):
        fail("bridge.remote_envs", remote_envs, f"must be a positive multiple of {prefix}.envs_per_worker "
             f"({p.envs_per_worker}): actor hosts run whole workers of two groups")


def rank_workers(p: PipelineConfig, ranks: int, prefix: str = "pipeline") -> tuple[int, int]:
    """(local workers, envs per worker) of one of ``ranks`` learner ranks: the run's workers divided where
    ``ranks`` divides them; else 1/``ranks`` of the run's envs in the fewest workers (at least the run's /
    ``ranks``, rounded up) whose groups divide the run's groups, so that the run's whole groups are a rank's too
    (CartPole's 2 workers of 8 envs on 4 ranks: 1 worker of 4 each); else refused."""
    if p.num_workers % ranks == 0:
        return p.num_workers // ranks, p.envs_per_worker
    envs, group = p.num_workers * p.envs_per_worker, p.envs_per_worker // GROUPS_PER_WORKER
    share = envs // ranks if envs % ranks == 0 else 0
    for workers in range(-(-p.num_workers // ranks), share // GROUPS_PER_WORKER + 1):
        per_worker = share // workers
        if share % workers == 0 and per_worker % GROUPS_PER_WORKER == 0 \
                and group % (per_worker // GROUPS_PER_WORKER) == 0:
            return workers, per_worker
    fail(f"{prefix}.num_workers", p.num_workers, f"{p.num_workers} workers of {p.envs_per_worker} envs cannot be "
         f"divided among {ranks} learner ranks (each takes 1/{ranks} of the envs, in workers whose groups divide "
         f"the run's groups of {group}): give a multiple of {ranks} workers")


def _rank_share(value: int, ranks: int) -> int:
    """A rank's share of a size given for the whole run (0 stays 0: automatic)."""
    return -(-value // ranks)


def _threads_per_group(p: PipelineConfig, workers: int, ranks: int) -> int:
    """envpool threads of each group: the cores (a learner rank's share of them) shared out over all local groups.
    Each group its worker's whole share measured worse on 2 cores (Pong 0.77-0.87 of raw vs 0.96-1.00, CartPole
    0.86 vs 1.18): a small group split over two threads waits on its slowest env every step."""
    total = max(1, (p.env_threads or usable_cores()) // ranks)
    return max(1, total // worker_groups(max(1, workers)))


def whole_groups(envs: int, p: PipelineConfig) -> int:
    """``envs`` rounded up to whole groups of ``p``'s workers (a V-trace batch); ``envs`` itself where ``p``'s
    workers make no groups (the builder names that field)."""
    if p.envs_per_worker < GROUPS_PER_WORKER or p.envs_per_worker % GROUPS_PER_WORKER:
        return envs
    group = p.envs_per_worker // GROUPS_PER_WORKER
    return -(-envs // group) * group


def actor_host_shape(groups: int, envs_per_group: int, env_threads: int) -> PipelineShape:
    """An actor host's: the ``groups`` groups of ``envs_per_group`` envs its learner assigned (whole workers),
    each with one unroll of one step (the step on its way to the learner, and its action)."""
    return pipeline_shape(PipelineConfig(num_workers=groups // GROUPS_PER_WORKER,
                                         envs_per_worker=envs_per_group * GROUPS_PER_WORKER,
                                         env_threads=env_threads, unroll_length=1, num_buffers=groups))


def sized_pipeline(p: PipelineConfig, envs: int, per_worker: int, remote_envs: int, given) -> tuple[dict, int]:
    """A machine's sizing of ``p`` (``Recipe.sizing``): the pipeline options that make ``envs`` local envs in
    workers of ``per_worker`` (min_batch_envs, where set, scaled with them), and the local envs that makes; none
    where that adds no envs. An option the user gave (``given(dotted name)``) stays, and the rest follow from it.
    With ``remote_envs`` that ``per_worker`` does not divide, workers of ``p``'s size, so actor hosts run whole
    workers like the learner's."""
    own = p.num_workers * p.envs_per_worker
    if envs <= own:
        return {}, own
    if remote_envs and remote_envs % per_worker or given("pipeline.envs_per_worker"):
        per_worker = p.envs_per_worker
    workers = p.num_workers if given("pipeline.num_workers") else max(1, envs // per_worker)
    out = {"pipeline.num_workers": workers, "pipeline.envs_per_worker": per_worker}
    if p.min_batch_envs and not given("pipeline.min_batch_envs"):
        out["pipeline.min_batch_envs"] = p.min_batch_envs * workers * per_worker // own
    out = {k: v for k, v in out.items() if not given(k)}
    return out, (workers * per_worker if out else own)
