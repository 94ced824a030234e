"""`--pipeline` (generate, chat, serve) and joining the ranks when `mlx.launch` started the
command: the target is split over them (distributed/); rank 0 runs the command, the
other ranks only follow its target passes."""

from __future__ import annotations

import click


def pipeline_option(f):
    return click.option("--pipeline", is_flag=True,
                        help="Under mlx.launch: split the target's layers over the ranks (mlx-lm's pipeline "
                             "parallel) instead of each layer's weights (tensor parallel, the default). "
                             "docs/distributed.md")(f)


def join(pipeline: bool = False, drafter: str | None = None):
    """This process's distributed.Sharding under mlx.launch with 2+ ranks, else None."""
    from ..distributed import from_launch

    return from_launch(pipeline, drafter)
