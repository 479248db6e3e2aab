"""A resumed run's config against the one its checkpoint saved: rebuilt from
the saved dict, compared field by field, and the one line the run prints."""

from __future__ import annotations

from seedlocal.errors import CheckpointError, fail


def from_dict(cls, d: dict, base=None):
    """A config dataclass rebuilt from ``dataclasses.asdict`` output (as saved
    in checkpoints): nested dataclasses recursively, lists back to tuples where
    the default is a tuple. Keys the class no longer has are dropped, fields
    the dict lacks keep their defaults (those of ``base``, default ``cls()``:
    a nested config keeps its parent's default, e.g. R2D2's LSTM size, not its
    own class's), so older checkpoints stay resumable."""
    import dataclasses

    base = cls() if base is None else base
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        default, v = getattr(base, f.name), d[f.name]
        if dataclasses.is_dataclass(default) and isinstance(v, dict):
            v = from_dict(type(default), v, default)
        elif isinstance(default, tuple) and isinstance(v, list):
            v = tuple(v)
        if type(default) is int and isinstance(v, float) and v.is_integer():
            v = int(v)  # e.g. total_steps=3e3 given to the Python API
        # A value of another kind than the default's (a file edited by hand or
        # damaged) would fail later, deep inside; name it here.
        kind = (int, float) if type(default) is float else type(default)
        if default is not None and not isinstance(v, kind) or isinstance(v, bool) and type(default) is not bool:
            raise TypeError(f"{f.name}={v!r}: expected {type(default).__name__}")
        kwargs[f.name] = v
    return dataclasses.replace(base, **kwargs)


def config_changes(old, new, prefix: str = "") -> list[str]:
    """``field: old -> new`` for every leaf that differs between two configs."""
    import dataclasses

    out = []
    for f in dataclasses.fields(new):
        a, b = getattr(old, f.name, None), getattr(new, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(b) and dataclasses.is_dataclass(a):
            out += config_changes(a, b, name + ".")
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


def saved_config(cls, saved: dict, path: str):
    """A checkpoint's saved config as ``cls`` (after ``cls.migrate``, where a
    config class has one for what older runs saved), or CheckpointError
    naming what is wrong with it."""
    try:
        if hasattr(cls, "migrate"):
            saved = cls.migrate(saved)
        return from_dict(cls, saved)
    except (TypeError, ValueError, AttributeError, KeyError) as e:  # a checkpoint edited by hand, or damaged
        raise CheckpointError(f"{path}: its saved configuration cannot be read ({type(e).__name__}: {e})") from None


def resume_line(saved: dict | None, cfg, path: str) -> str:
    """The one line a resumed run prints: what differs from the saved config."""
    if saved is None:
        return f"seedlocal: resuming {path} (it holds no saved configuration; using this one as given)"
    changes = [c for c in config_changes(saved_config(type(cfg), saved, path), cfg) if not c.startswith("resume:")]
    if not changes:
        return f"seedlocal: resuming {path} with its saved configuration"
    return f"seedlocal: resuming {path}; changed from its saved configuration: " + "; ".join(changes)


def budget_left(field: str, budget: int, done: int, unit: str) -> None:
    """A resumed run whose budget is already spent would start its workers
    only to stop at once and rewrite its summary with an empty one."""
    if budget and done >= budget:
        fail(field, budget, f"the resumed run already has {done:,d} {unit}; give a larger budget")
