"""A target too large for one machine, sharded over the ranks of `mlx.launch`.

Owns: knowing that this process runs under `mlx.launch` and which rank it is
(`from_launch`); splitting the target with mlx-lm's own `shard` (tensor parallel, the
default) or `pipeline` (layers, `--pipeline`), and each rank's memory check against its
share (`sharding.py`); the small messages rank 0 sends the other ranks (`channel.py`);
and keeping every rank's target cache in step with rank 0's (`mirror.py`).  The draft
and the decoder run on rank 0 only, as they are; the other ranks load only their shard
of the target and follow rank 0's target passes until it ends.

May import: errors, util, core, models, trees (floor 9, beside the decoder it serves).
"""

from __future__ import annotations

from .sharding import Sharding, from_launch, launched  # noqa: F401 (public)
