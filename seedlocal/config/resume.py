"""A resumed run's config against the one its checkpoint saved: rebuilt from the saved dict, compared field by
field, and the one line the run prints."""

from __future__ import annotations

import dataclasses

from seedlocal.errors import CheckpointError


def from_dict(cls, d: dict, base=None):
    """A config dataclass rebuilt from ``dataclasses.asdict`` output (as saved in checkpoints): nested
    dataclasses recursively, lists back to tuples where the default is a tuple. Keys the class no longer has
    are dropped, fields the dict lacks keep ``base``'s values (default ``cls()``: a nested config keeps its
    parent's default, e.g. R2D2's LSTM size), so older checkpoints stay resumable."""
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
        # A value of another kind than the default's (a file edited by hand or damaged): named here, not deep inside.
        kind = (int, float) if type(default) is float else type(default)
        if default is not None and not isinstance(v, kind) or isinstance(v, bool) and type(default) is not bool:
            raise TypeError(f"{f.name}={v!r}: expected {type(default).__name__}")
        kwargs[f.name] = v
    return dataclasses.replace(base, **kwargs)


def leaves(obj, prefix: str = "") -> dict[str, object]:
    """Every option's value in the config ``obj`` by its dotted name, in field order."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        value, name = getattr(obj, f.name), prefix + f.name
        out.update(leaves(value, name + ".") if dataclasses.is_dataclass(value) else {name: value})
    return out


def config_changes(old, new, prefix: str = "", sep: str = ": ") -> list[str]:
    """``field: old -> new`` (``sep`` after the field) for every option that differs between two configs of one
    class."""
    before = leaves(old, prefix)
    return [f"{name}{sep}{before[name]!r} -> {b!r}" for name, b in leaves(new, prefix).items() if before[name] != b]


def saved_config(cls, saved: dict, path: str):
    """A checkpoint's saved config as ``cls`` (a ``RunConfig``, after its ``migrate`` for what older runs saved),
    or CheckpointError naming what is wrong with it."""
    try:
        return from_dict(cls, cls.migrate(saved))
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

