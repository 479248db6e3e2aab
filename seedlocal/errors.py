"""The errors seedlocal stops with, each one line for the user: the CLI prints it after ``seedlocal: error:`` and
exits (2 for a config or checkpoint the user can fix, 1 for a run that broke); the Python API raises it, every
kind catchable as ``SeedlocalError``. Nothing here imports anything, so every module may raise them.
"""


class SeedlocalError(Exception):
    """What the command line prints as one ``seedlocal: error:`` line, raised by the Python API as it is: a
    config, checkpoint or env that cannot work, or a run that broke. Its subclass names which."""


class ConfigError(SeedlocalError, ValueError):
    """A configuration value that cannot work (its message starts with the field and the value)."""


def fail(field: str, value, why: str) -> None:
    """Raise the one-line refusal of a config value: ``field=value: why``."""
    raise ConfigError(f"{field}={value!r}: {why}")


def fail_if(bad, obj, names: tuple[str, ...], why: str, prefix: str = "") -> None:
    """``fail`` for the first of ``obj``'s options ``names`` whose value is ``bad(value)``, named ``prefix + name``."""
    for name in names:
        if bad(value := getattr(obj, name)):
            fail(prefix + name, value, why)


class CheckpointError(SeedlocalError, ValueError):
    """A checkpoint that cannot be used: missing, unreadable or for another config."""


class Diverged(SeedlocalError, RuntimeError):
    """Training produced NaN or inf weights: they are not saved over good ones."""


class WorkerDied(SeedlocalError, RuntimeError):
    """An env worker exited and may not be restarted."""


class EnvContractError(SeedlocalError, ValueError):
    """An env broke the Gymnasium contract (non-finite reward, observation outside its space's shape): a restarted
    worker would meet it again."""
