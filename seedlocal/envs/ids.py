"""Which backend runs an env id: envpool's registry first, then Gymnasium's (``module:EnvId`` ids import their
module, which registers them; namespaces such as ``MinAtar/`` are registered through their package's entry point).
Refusals name ``env.id`` or ``env.backend`` and, for an unknown id, the ids it may have meant."""

from __future__ import annotations

import difflib
import functools
import importlib
import re
import sys


BACKENDS = ("auto", "envpool", "gymnasium", "null")


@functools.lru_cache(maxsize=1)
def envpool_ids() -> frozenset[str]:
    try:
        import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


def _gymnasium_ids() -> frozenset[str]:
    import gymnasium

    return frozenset(gymnasium.registry.keys())


def _unknown_id(env_id: str, why: str, otherwise: str = "") -> ValueError:
    """The error for an id nothing registered, with the ids it may have meant: the same name's latest version first
    (seedlocal wants the version spelled out: a run's checkpoints are for one version), then near spellings."""
    name = env_id.partition(":")[2] or env_id
    known = envpool_ids() | _gymnasium_ids()
    versions = sorted((int(m.group(1)), i) for i in known if (m := re.fullmatch(re.escape(name) + r"-v(\d+)", i)))
    near = [i for _, i in reversed(versions)] or difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(near[:3])}?" if near else otherwise
    return ValueError(f"env.id={env_id!r}: {why}{hint}")


# Namespaces of Gymnasium ids that a package registers when asked, and what installs it.
NAMESPACE_PACKAGES = {"MinAtar": "minatar (pip install 'seedlocal[minatar]')"}
_registered: set[str] = set()  # namespaces this process has registered


def register_namespace(env_id: str) -> None:
    """Register the ids of ``env_id``'s namespace (``MinAtar/Breakout-v1``) through the package that declares it as
    a ``gymnasium.envs`` entry point (the plugin hook Gymnasium 0.x loaded by itself and 1.x no longer does), so no
    shim module is needed. Called wherever Gymnasium makes an env, worker processes included (they start fresh:
    spawn). Other ids: nothing."""
    namespace, slash, _ = env_id.partition("/")
    if not slash or ":" in env_id or namespace in _registered or env_id in _gymnasium_ids():
        return
    from importlib.metadata import entry_points

    for ep in entry_points(group="gymnasium.envs", name=namespace):
        try:
            register = ep.load()
            if callable(register):
                register()
        except Exception as e:
            raise ValueError(f"env.id={env_id!r}: {ep.value} (which registers {namespace}/ ids) failed: "
                             f"{type(e).__name__}: {e}") from None
        _registered.add(namespace)  # once per process: a misspelled id must not register it again
        return
    if namespace in NAMESPACE_PACKAGES and env_id not in envpool_ids():
        raise ValueError(f"env.id={env_id!r}: {namespace}/ ids need the package {NAMESPACE_PACKAGES[namespace]}")


def resolve_backend(env_id: str, backend: str = "auto") -> str:
    """The backend that will run ``env_id``; ValueError if none can. Gymnasium's ``module.path:EnvId-v0`` form has
    its module imported here, whose import registers the id; ``gymnasium.make`` accepts the same form and imports the
    module itself, so worker processes and ``eval`` need nothing but the id string."""
    if backend not in BACKENDS:
        raise ValueError(f"env.backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    if ":" in env_id:  # a user's own Gymnasium env, registered by its module
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"env.id={env_id!r}: cannot import module {module!r} ({e}); "
                             "it must be importable (installed, or on PYTHONPATH)") from None
        except Exception as e:
            raise ValueError(f"env.id={env_id!r}: importing {module!r} failed: {type(e).__name__}: {e}") from None
        if name not in _gymnasium_ids():
            raise _unknown_id(env_id, f"importing {module!r} did not register {name!r} with Gymnasium",
                              " (the module should call gymnasium.register)")
        if backend == "envpool":
            raise ValueError(f"env.id={env_id!r}: a module:EnvId id is a Gymnasium env, not an envpool one")
        return "gymnasium" if backend == "auto" else backend
    register_namespace(env_id)
    in_envpool = env_id in envpool_ids()
    if backend == "auto":
        if in_envpool:
            return "envpool"
        if env_id in _gymnasium_ids():
            return "gymnasium"
        raise _unknown_id(env_id, "not an envpool id nor a registered Gymnasium id "
                          "(see envpool.list_all_envs() and gymnasium.pprint_registry())")
    if backend == "envpool" and not in_envpool:
        raise ValueError(f"env.id={env_id!r}: not an envpool id (env.backend=envpool)")
    if backend == "gymnasium" and env_id not in _gymnasium_ids():
        raise ValueError(f"env.id={env_id!r}: not a registered Gymnasium id (env.backend=gymnasium)")
    if backend == "null" and not (in_envpool or env_id in _gymnasium_ids()):
        raise ValueError(f"env.id={env_id!r}: the null backend copies a real env's spaces; unknown id")
    return backend


def registered_in_main(env_id: str) -> bool:
    """Whether the Gymnasium id's entry point lives in ``__main__`` (a script, notebook or ``python -``'s own
    code), which an env worker process sees only if that code has a file it runs again, and then only the part
    outside its ``if __name__ == "__main__":`` block."""
    gymnasium = sys.modules.get("gymnasium")
    if gymnasium is None:  # never imported here: nothing registered in this process
        return False
    try:
        entry = gymnasium.spec(env_id.rpartition(":")[2]).entry_point
    except Exception:
        return False
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", None)
    return module == "__main__"


def main_registration_problem(env_id: str, main_has_file: bool) -> str:
    """Why an env worker could not make ``env_id``, registered in ``__main__``: the words to end its error with."""
    if not main_has_file:
        return (f"{env_id!r} is registered by code in __main__ (a notebook, `python -c` or standard input), which "
                "the env worker processes cannot run: put the env class and its gymnasium.register(...) in a module "
                f"file and pass env.id='<module>:{env_id.rpartition(':')[2]}'")
    return (f"{env_id!r} is registered in __main__; a worker runs that file again without its "
            "`if __name__ == \"__main__\":` block, so register the env at the file's top level or in a module")
