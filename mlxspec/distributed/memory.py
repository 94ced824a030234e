"""Each rank's memory check: its share of the target (and, on rank 0, the draft).

Tensor parallel (mlx-lm's `shard`): every tensor inside a layer is split over the
ranks; the embeddings, the final norm and the head are whole on each; the KV cache
holds 1/N of the key/value heads.  Pipeline (`pipeline`): a rank holds its run of
layers (mlx-lm's even split, the low ranks one more) plus the embeddings and head, and
their KV cache.  The figures follow models/memory.py's rules for the rest.
"""

from __future__ import annotations

import re

from ..errors import MlxspecError

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_range(layers: int, rank: int, size: int) -> tuple[int, int]:
    """mlx-lm's pipeline split (models/pipeline.py): rank 0 gets the last layers."""
    base, extra = divmod(layers, size)
    split = [base + (1 if r < extra else 0) for r in range(size)]
    start = sum(split[rank + 1:])
    return start, start + split[rank]


def rank_share(tensors, config: dict, rank: int, size: int, pipeline: bool) -> tuple[list, dict]:
    """(this rank's tensors, a config whose KV cache is this rank's)."""
    from ..models.memory import text_config

    c = dict(text_config(config))
    layers = int(c.get("num_hidden_layers", 0))
    out = []
    if pipeline:
        start, end = layer_range(layers, rank, size)
        for t in tensors:
            m = LAYER.search(t[2] if len(t) > 2 else "")
            if m is None or start <= int(m.group(1)) < end:
                out.append(t)
        c["num_hidden_layers"] = end - start
    else:
        for dtype, shape, *name in tensors:
            if shape and name and LAYER.search(name[0]) and len(shape) >= 1:
                shape = (-(-shape[0] // size), *shape[1:])
            out.append((dtype, tuple(shape), *name))
        kv = c.get("num_key_value_heads") or c.get("num_attention_heads")
        if isinstance(kv, int):
            if "head_dim" not in c and c.get("hidden_size") and c.get("num_attention_heads"):
                c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]  # kept as the whole model's
            c["num_key_value_heads"] = max(1, kv // size)
    return out, c


def check_rank_fits(target_dir, draft_dir, rank: int, size: int, pipeline: bool, context: int = 2048,
                    budget_bytes: int | None = None):
    """models/memory.check_pair_fits for one rank's share; MLXSPEC_NO_MEMORY_CHECK=1 skips it."""
    from ..models.memory import fmt_bytes, folder_budget

    budget = folder_budget(target_dir, draft_dir, context, budget_bytes,
                           share=lambda tensors, cfg: rank_share(tensors, cfg, rank, size, pipeline),
                           labels=(f"target share (rank {rank} of {size})", "draft"))
    if budget is None:
        return None
    if not budget.fits:
        raise MlxspecError(
            f"rank {rank}: its share of the target{' and the draft' if draft_dir is not None else ''} needs about "
            f"{fmt_bytes(budget.total)} at a {context}-token context but only {fmt_bytes(budget.usable)} is usable "
            f"({budget.usable_source}); add ranks, use a quantised target, or a smaller one "
            "(MLXSPEC_NO_MEMORY_CHECK=1 skips this check)")
    return budget
