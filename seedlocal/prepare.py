"""A run prepared once: ``prepare(request, recipe) -> Prepared``.

The command line and the Python API each make a ``Request`` (``config/request.py``: only what the user gave);
this is the only place that turns one into a run (DESIGN.md, decision 11), in this order:

    1. what the options apply to: a resumed run's saved config, else the preset asked for by name, else the
       one made for the env's kind (the env described once), fitted to the frames the env sends;
    2. the options given over it, a pipeline file's (``--pipeline-config``) beneath the command line's;
    3. the machine's sizes where the user gave none (``Recipe.sizing``; a resumed run keeps its own), and what
       follows from the options whatever the machine (``Recipe.derive``);
    4. a resumed run's budget and folder checked against its checkpoint;
    5. the checks every family shares, the env described, the shape built, the family's own checks.

Everything below (trainer, pipeline, bridge) receives the frozen ``Prepared`` and derives nothing from the
config again; a data-parallel rank's is ``for_rank``. What preparation has to say (the preset picked, the sizes
chosen) is in ``notes``, said by the caller once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from seedlocal.config.checks import validate_bridge, validate_pipeline, validate_run_options
from seedlocal.config.machine import Machine
from seedlocal.config.overrides import apply, load_pipeline_file
from seedlocal.config.request import Request, is_given
from seedlocal.config.resume import config_changes, saved_config
from seedlocal.envs.spaces import describe, validate_env, with_box_actions
from seedlocal.errors import CheckpointError, ConfigError, fail
from seedlocal.recipes import Kind, Recipe, kind_of
from seedlocal.shape import PipelineShape, ShapeNeeds, pipeline_shape
from seedlocal.spec import EnvSpec

SIZED = "--no-machine-sizing keeps the preset's"


@dataclass(frozen=True)
class Resumed:
    """The run a request resumes: its checkpoint's path, saved config (None in the oldest) and counters."""

    path: str
    saved: dict | None
    counters: dict


@dataclass(frozen=True)
class Prepared:
    """A run as it will go: nothing below derives any of it again."""

    recipe: Recipe
    config: object
    """the run configuration, final (a data-parallel rank's: its share, ``for_rank``)"""
    spec: EnvSpec
    kind: Kind
    shape: PipelineShape
    """the pipeline's sizes (a data-parallel rank's: the run's divided)"""
    notes: tuple[str, ...] = ()
    """what preparation says, in order (the preset picked, the sizes chosen), one line each"""


def prepare(request: Request, recipe: Recipe, machine: Machine | None = None) -> Prepared:
    """The run ``request`` asks ``recipe``'s family for (module docstring), sized for ``machine`` (default: this
    one). A value that cannot run is refused here in one line naming its field, before any process starts."""
    notes: list[str] = []
    cfg, resumed, given = _configured(request, recipe, machine, notes)
    derived = apply(cfg, recipe.derive(cfg, is_given(given)))
    notes += [f"seedlocal: {c}, to fit its groups" for c in config_changes(cfg, derived, sep=" ")]
    cfg = derived
    if resumed is not None:
        _check_resume(cfg, resumed)
    return prepare_run(cfg, recipe, tuple(notes))


def _configured(request: Request, recipe: Recipe, machine: Machine | None, notes: list[str]):
    """Steps 1 to 3 but ``derive`` (module docstring): (the config, the run it resumes, the options given)."""
    resumed = _resumed(request, recipe)
    given = dict(request.options)
    if request.pipeline_config:  # a pipeline file's options, beneath the command line's own
        given = {**{f"pipeline.{k}": v for k, v in load_pipeline_file(request.pipeline_config).items()}, **given}
    cfg = apply(_base(request, recipe, resumed, notes), given)
    if resumed is None and request.machine_sizing:
        cfg = _sized(cfg, recipe, machine or Machine.detect(cfg.pipeline.device), given, notes)
    return cfg, resumed, given


def prepare_run(cfg, recipe: Recipe, notes: tuple[str, ...] = ()) -> Prepared:
    """Step 5 (module docstring) of a run configuration, or of one built whole in Python (the benchmark scripts,
    the tests: no preset, no sizing): the checks every family shares, the env described, the shape built (once),
    the family's own checks, and with ``learners`` > 1 each rank's share refused before any starts."""
    validate_run_options(cfg)
    spec, shape = prepare_pipeline(cfg.env, cfg.pipeline, cfg.bridge, needs=recipe.needs(cfg))
    recipe.check(cfg, spec, shape)
    prepared = Prepared(recipe, cfg, spec, kind_of(spec), shape, notes)
    if cfg.learners > 1:  # ranks that cannot divide its shape and batch (for_rank: every rank's share is alike)
        for_rank(prepared, 0, cfg.learners, cfg)
    return prepared


def preset_for(recipe: Recipe, env_id: str):
    """The preset ``prepare`` starts ``env_id``'s runs of ``recipe`` from: the one made for its kind, fitted to
    its frames (CartPole's where it has none)."""
    return _base(Request({"env.id": env_id}), recipe, None, [])


def for_help(request: Request, recipe: Recipe):
    """The defaults ``--help`` shows: the run ``request`` would prepare, as far as it can be prepared (the
    preset alone where its options do not make a run)."""
    try:
        return _configured(request, recipe, None, [])[0]
    except (ConfigError, CheckpointError):
        return recipe.presets.get(request.preset) or next(iter(recipe.presets.values()))


def for_rank(prepared: Prepared, rank: int, ranks: int, config) -> Prepared:
    """Learner rank ``rank``'s of ``ranks``: ``config`` (its share of the run's: ``pipeline/ranks.py``) as its
    family divides it (``Recipe.per_rank``), its shape the run's divided."""
    recipe = prepared.recipe

    def shape_of(cfg) -> PipelineShape:
        return pipeline_shape(cfg.pipeline, cfg.bridge, recipe.needs(cfg), rank=rank, ranks=ranks)

    share = recipe.per_rank(config, ranks, shape_of)
    return dataclasses.replace(prepared, config=share, shape=shape_of(share))


def prepare_pipeline(env, pipeline, bridge=None, prefix: str = "pipeline", env_field: str = "env.id",
                     needs: ShapeNeeds = ShapeNeeds()) -> tuple[EnvSpec, PipelineShape]:
    """The env's spec and the pipeline's shape (for a trainer that ``needs`` it so), checked as a run's are, each
    field named under ``prefix`` (the env's id ``env_field``): a run's, or one without a family (``seedlocal
    bench``, the benchmark scripts)."""
    validate_pipeline(pipeline, prefix=prefix)
    shape = pipeline_shape(pipeline, bridge, needs, prefix=prefix)
    if bridge is not None:
        validate_bridge(bridge)
    return validate_env(env, id_field=env_field), shape


# The env described without a run: for ``seedlocal bench``, which sizes its pipeline by it (ConfigError naming its
# field), and for an actor host (``seedlocal actors``), which runs the one its learner assigns (ValueError).
env_spec = validate_env
host_env = describe


def checkpoint_spec(state: dict) -> EnvSpec:
    """The env a checkpoint was trained on, as it is here now; CheckpointError unless its observations and actions
    are still those the network was trained on (a user's own env may have changed). Read inside
    ``trainers/run.rebuilding``, which names what a damaged identity raises."""
    from seedlocal import checkpoint
    from seedlocal.networks import action_identity, obs_identity

    ident = state.get("identity", {})
    spec = describe(ident["env_id"], "auto", int(ident.get("env_frame_stack", 0)))
    # Its Box actions meet their bounds as they did in training (an older checkpoint's were clipped).
    spec = with_box_actions(spec, ident.get("box_actions", checkpoint.IDENTITY_BEFORE_KEY["box_actions"]))
    checkpoint.check_compatible(state, {"num_actions": spec.num_actions, **obs_identity(spec), **action_identity(spec)})
    return spec


# -- the steps -----------------------------------------------------------------------------------------------


def _resumed(request: Request, recipe: Recipe) -> Resumed | None:
    path = request.options.get("resume")
    if not path:
        return None
    from seedlocal import checkpoint  # torch: not for an actor host, which imports this module for host_env

    state = checkpoint.load(path)
    wrote = state.get("identity", {}).get("algo")
    if wrote != recipe.name:
        raise ConfigError(f"resume={path!r}: {state.get('path')} is a run of seedlocal train {wrote}; resume it with "
                          f"seedlocal train {wrote} --resume {path}")
    if request.preset:
        raise ConfigError("preset: a resumed run keeps the configuration saved with it; "
                          "give the options to change explicitly instead")
    saved = state.get("config")
    return Resumed(str(state["path"]), saved if isinstance(saved, dict) else None, dict(state.get("counters", {})))


def _base(request: Request, recipe: Recipe, resumed: Resumed | None, notes: list[str]):
    """What the options apply to: the resumed run's saved config, the preset by name, or the preset made for the
    env's kind, fitted to the frames the env sends."""
    if resumed is not None:
        return saved_config(recipe.run, resumed.saved, resumed.path) if resumed.saved else recipe.run()
    if request.preset:
        if request.preset not in recipe.presets:
            raise ConfigError(f"preset={request.preset!r}: expected one of {', '.join(recipe.presets)}")
        return recipe.presets[request.preset]
    env_id = request.options.get("env.id")
    if env_id is None:
        return recipe.presets["cartpole"]
    backend = request.options.get("env.backend", "auto")
    try:
        # Arguments as validation passes them (id, backend, frame_stack), so its describe() is this cached one.
        spec = describe(env_id, backend, 0)
    except Exception:
        return recipe.presets["cartpole"]  # validation names the env's problem
    kind = kind_of(spec)
    preset = recipe.presets.get(kind.name)
    if preset is None or kind.name == "cartpole":
        notes.append(f"seedlocal: --preset cartpole, the plain defaults: no other preset of this algorithm is made "
                     f"for {env_id}'s kind{_dict_images(spec)}")
        return recipe.presets["cartpole"]
    from seedlocal.algos.frames import fit_frames  # torch, which an actor host (host_env) never needs

    fitted = fit_frames(preset, spec, lambda: describe(env_id, backend, preset.env.frame_stack))
    frames = ("" if fitted is preset else f", its frames as the env sends them, stacked {fitted.frame_stack} deep "
              "beside the network" if getattr(fitted, "frame_stack", 0) > 1 else ", its frames as the env sends them")
    notes.append(f"seedlocal: --preset {kind.name}, made for {kind.what} like {env_id}'s{frames} (--preset "
                 "cartpole for the plain defaults)")
    return fitted


def _dict_images(spec) -> str:
    """Words for a Dict observation's image fields, which auto gives a CNN each beside the MLP, or ""."""
    from seedlocal.networks import image_fields

    images = image_fields(spec)
    if not images:
        return ""
    many = len(images) > 1
    return (f" (the Dict's image field{'s' * many} {', '.join(map(repr, images))} get{'' if many else 's'} a CNN "
            f"of {'their' if many else 'its'} own beside the MLP of the other fields; --network.encoder mlp "
            f"flattens {'them' if many else 'it'} into the MLP)")


def _sized(cfg, recipe: Recipe, machine: Machine, given: dict, notes: list[str]):
    """``cfg`` sized for ``machine`` where the user gave no size (``Recipe.sizing``), said in one line."""
    try:
        kind = kind_of(describe(cfg.env.id, cfg.env.backend, cfg.env.frame_stack))
    except Exception:
        return cfg  # validation names the env's problem
    sized = apply(cfg, recipe.sizing(cfg, kind, machine, is_given(given)))
    said = config_changes(cfg, sized, sep=" ")
    if said:
        note = ""
        if "bridge.remote_envs" in given and "pipeline.envs_per_worker" not in given:
            free = apply(cfg, recipe.sizing(apply(cfg, {"bridge.remote_envs": 0}), kind, machine, is_given(
                {k: v for k, v in given.items() if k != "bridge.remote_envs"})))
            unlike = config_changes(sized.pipeline, free.pipeline, "pipeline.", " ")
            if unlike:
                note = (f" (workers of the preset's size, so that --bridge.remote-envs {given['bridge.remote_envs']} "
                        f"makes whole ones; without it {', '.join(unlike)})")
        notes.append(f"seedlocal: sized for this machine ({machine}): {', '.join(said)}{note}; {SIZED}")
    return sized


def _check_resume(cfg, resumed: Resumed) -> None:
    """A resumed run goes on where its checkpoints are, and only with budget left: one spent would start its
    workers only to stop at once and rewrite its summary with an empty one."""
    if resumed.saved is not None:
        for name in ("run_name", "log_dir"):
            if name in resumed.saved and getattr(cfg, name) != resumed.saved[name]:
                raise ConfigError(f"{name}={getattr(cfg, name)!r}: a resumed run goes on in its own folder "
                                  f"({cfg.resume}); leave --{name.replace('_', '-')} out")
    for name, counter, unit in cfg.budgets:
        budget, done = getattr(cfg, name), resumed.counters.get(counter, 0)
        if budget and done >= budget:
            fail(name, budget, f"the resumed run already has {done:,d} {unit}; give a larger budget")

