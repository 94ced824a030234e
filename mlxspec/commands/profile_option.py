"""`--cost-profile NAME|FILE` (generate) and `--profile NAME|FILE` (bench): decide with another
machine's costs (costs/profiles.py, docs/profiles.md), checked while the command line is parsed."""

from __future__ import annotations

import click


def _check(ctx, param, value):
    if value is None:
        return None
    from ..costs.profiles import load_profile
    from ..errors import MlxspecError

    try:
        load_profile(value)  # a bad name or file fails here, in one line, before anything is loaded
    except MlxspecError as e:
        raise click.BadParameter(str(e))
    return value


def cost_profile_option(*names: str, help_extra: str = ""):
    from ..costs.profiles import names as profile_names

    return click.option(*(names or ("--cost-profile",)), "cost_profile", default=None, callback=_check,
                        metavar="NAME|FILE",
                        help="Decide how much to draft by another machine's costs instead of this one's calibration: "
                             f"{', '.join(profile_names())}, or a profile file (docs/profiles.md)." + help_extra)
