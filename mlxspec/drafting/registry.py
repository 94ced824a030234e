"""Drafter names: the built-in ones and those of `drafters.DRAFTERS`, one rule for the
CLI, the Python API, sessions and the server."""

from __future__ import annotations

from ..core.options import BadValue
from ..util.untrusted import printable
from .drafters import DRAFTERS

BUILT_IN_DRAFTERS = ("model", "hybrid", "none")  # make_drafter's own; the rest come from drafters.DRAFTERS


def drafter_names() -> tuple:
    return BUILT_IN_DRAFTERS + tuple(DRAFTERS)


def check_drafter(value):
    """A drafter name (or None: the default), else BadValue."""
    if value is None:
        return None
    names = drafter_names()
    if not isinstance(value, str) or value not in names:
        message = f"unknown drafter {printable(repr(value))}: choose one of {', '.join(names)}"
        raise BadValue("drafter", "", value, message)
    return value
