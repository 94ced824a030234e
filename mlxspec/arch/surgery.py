"""Changing an mlx-lm model's modules without re-implementing it.

`View`: a module with some attributes overridden.  Calling a view runs the original class's own `__call__` on it, so the model's
forward code (embedding scale, masks, norms, tied head, soft-capping...) is
reused, never re-implemented.  Layer skipping (drafting/drafters.py) swaps the layer list;
the pruned draft head (drafting/vocab_subset.py) swaps the output projection."""

from __future__ import annotations

import mlx.nn as nn


class View:
    def __init__(self, base, **overrides):
        self.__dict__["_base"] = base
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)

    def __call__(self, *args, **kwargs):
        return type(self.__dict__["_base"]).__call__(self, *args, **kwargs)


def _parent(model: nn.Module, path: str):
    obj = model
    *parts, last = path.split(".")
    for p in parts:
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    return obj, last


def module_at(model: nn.Module, path: str) -> nn.Module:
    """The module at `path` (a `named_modules` name) of `model`."""
    parent, name = _parent(model, path)
    return parent[int(name)] if isinstance(parent, list) else parent[name]


module_changes = 0  # put_module calls so far: a compiled forward traced before one is stale (cpu/compiled_forward.py)


def put_module(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put `new` where `model` calls the module at `path` (its forward is unchanged)."""
    global module_changes
    module_changes += 1
    parent, name = _parent(model, path)
    if isinstance(parent, list):
        parent[int(name)] = new
    else:
        setattr(parent, name, new)
