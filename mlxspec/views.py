"""A view of an mlx-lm module with some attributes overridden.

Calling a view runs the original class's own `__call__` on it, so the model's
forward code (embedding scale, masks, norms, tied head, soft-capping...) is
reused, never re-implemented.  Layer skipping (drafters.py) swaps the layer list;
the pruned draft head (vocab_subset.py) swaps the output projection."""

from __future__ import annotations


class View:
    def __init__(self, base, **overrides):
        self.__dict__["_base"] = base
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)

    def __call__(self, *args, **kwargs):
        return type(self.__dict__["_base"]).__call__(self, *args, **kwargs)
