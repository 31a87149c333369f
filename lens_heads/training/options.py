"""The training options of a command: every field of `TrainConfig` as a ``--flag`` (plumbing.settings), so a field
added to the config is an option of every script that trains at once, spelled the same in each."""

from __future__ import annotations

import dataclasses
from typing import Any

from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.settings import default_of, option
from lens_heads.training.config import TrainConfig

# other spellings the analyses' flags had before they were built from the config
ALIASES = {"batch_size": ("--batch",), "seq_len": ("--seq",), "warmup_steps": ("--warmup",)}


def train_options(*, leave_out: tuple[str, ...] = (), **defaults: Any) -> type:
    """A frozen settings dataclass to extend (``class MySettings(train_options(steps=200)):``) whose fields are
    `TrainConfig`'s with their help, ``defaults`` overriding the config's; ``leave_out``: the fields the command sets
    itself (in `train_config`). Its ``train_config(**values)`` is the `TrainConfig` of the settings' fields and
    ``values``."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = (set(defaults) | set(leave_out)) - names
    if unknown:
        raise InputError(f"train_options: {sorted(unknown)} are not TrainConfig fields ({', '.join(sorted(names))})")
    fields = [(f.name, f.type, option(defaults.get(f.name, default_of(f)), f.metadata.get("help", ""),
                                      choices=f.metadata.get("choices"), aliases=ALIASES.get(f.name, ())))
              for f in dataclasses.fields(TrainConfig) if f.name not in leave_out]
    return dataclasses.make_dataclass("TrainOptions", fields, frozen=True,
                                      namespace={"train_config": _train_config, "__doc__": train_options.__doc__})


def _train_config(settings, **values: Any) -> TrainConfig:
    own = {f.name: getattr(settings, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(settings, f.name)}
    return TrainConfig(**{**own, **values})
