"""One round with a draft tree: the draft grows a tree (trees/drafter.py), the
target scores the pending tokens and every node in ONE forward pass
(trees/attention.py), the acceptance rule walks the tree (trees/acceptance.py),
and both caches keep exactly the accepted path (`TreeBlock.commit`).

`TreeVerifier.supported(...)` says whether a pair can use trees (both models of
a type tree attention is checked for; a model drafter; the per-token policy,
whose cost model sizes the tree); otherwise the loop verifies chains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import numpy as np

from .. import cpu
from ..drafting.drafters import ModelDrafter
from ..errors import MlxspecError
from ..core.coupled import Coupling
from ..core.kv_window import is_bounded
from ..core.sampling import SamplingParams, greedy_scores, lazy_normalised, process_logits
from . import acceptance as tree_acceptance
from .acceptance import walk_greedy
from ..core.acceptance import near_ties
from .attention import TreeBlock, tree_support
from .budget import TreeBudget
from .drafter import TreeDraft


@dataclass
class TreeResult:
    nodes: int  # tree size (drafted tokens verified)
    depth: int
    accepted: list  # accepted tokens, root first
    next_token: int
    outcomes: list  # (confidence, kept) for the policy
    siblings_taken: int  # accepted nodes that were not their parent's first child (a chain would have stopped)
    lookup_taken: int  # accepted nodes proposed by prompt lookup
    budget: TreeBudget  # its stop_reason says why the tree stopped growing
    draft_time: float  # seconds spent growing the tree
    ties: list | None = None  # greedy: near-tie flags of the emitted rows (core/acceptance.near_ties)
    logprobs: object = None  # the target's processed (N, V) log-probabilities (row 0 the root, 1 + j after node j)
    rows: list | None = None  # the rows the emitted tokens were chosen from, root first


# Why a pair verifies chains (`NoTrees.kind`).  The first two are what the user chose
# (a chain drafter, a fixed --num-draft); the others they would not expect, so the
# loop says so in the stats even when trees were not asked for (NOTED_KINDS).
DRAFTER, FIXED_K, MODEL_TYPE, BOUNDED_CACHE = "drafter", "fixed k", "model type", "bounded cache"
OLD_MLX = "old mlx"
NOTED_KINDS = frozenset({MODEL_TYPE, BOUNDED_CACHE, OLD_MLX})

# Tree verification gives each node its own RoPE position: `mx.fast.rope` with an array of
# offsets, one per batch row (ml-explore/mlx#2564, first released in MLX 0.29.1).  An older
# MLX verifies chains, with a one-line note; never a wrong answer.
TREES_NEED_MLX = (0, 29, 1)


def mlx_version(text: str | None = None) -> tuple:
    """MLX's version as numbers, ("0.29.1.dev2025..." -> (0, 29, 1)); (0,) when unreadable."""
    import re

    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(getattr(mx, "__version__", "") if text is None else text))
    return tuple(int(g) for g in m.groups() if g is not None) if m else (0,)


class NoTrees(NamedTuple):
    kind: str  # one of the kinds above
    text: str  # why, in one phrase (shown after "verifying chains: ")


def tree_unsupported(target, drafter, policy) -> NoTrees | None:
    """None when trees can be used with `target` (a ModelState); else why not."""
    if mlx_version() < TREES_NEED_MLX:
        return NoTrees(OLD_MLX, f"MLX {getattr(mx, '__version__', '?')} has no per-row RoPE offsets, which token "
                                f"trees need (MLX {'.'.join(map(str, TREES_NEED_MLX))} or later: pip install -U mlx)")
    if type(drafter) is not ModelDrafter:
        return NoTrees(DRAFTER, f"the {drafter.name} drafter proposes chains")
    if not hasattr(policy, "cost"):
        return NoTrees(FIXED_K,
                       "a fixed --num-draft drafts chains (trees are sized by the cost model: --num-draft auto)")
    for what, state in (("target", target), ("draft", drafter.state)):
        why = tree_support(state.model)
        if why is not None:
            return NoTrees(MODEL_TYPE, f"the {what}'s {why}")
    if is_bounded(target.cache) or is_bounded(drafter.state.cache):
        return NoTrees(BOUNDED_CACHE, "the KV cache is bounded (max_kv_size): token trees need a full KV cache")
    return None


def _seed(key) -> int:
    return int(mx.random.randint(0, 2**31 - 1, key=key).item())


def run_tree_round(target, drafter, policy, history: list[int], k: int, params: SamplingParams,
                   k_draft, k_verify, target_name: str, lookup=None) -> TreeResult:
    """`lookup`: a PromptLookupDrafter whose continuation is the tree's spine (trees/drafter.py)."""
    t0 = time.perf_counter()
    budget = TreeBudget(policy, k)
    coupling = k_draft if isinstance(k_draft, Coupling) else None  # coupled sampling (core/coupled.py)
    rng = None if params.greedy or coupling is not None else np.random.default_rng(_seed(k_draft))
    draft = TreeDraft(drafter, history, params, rng, budget, lookup, coupling)
    draft_time = time.perf_counter() - t0
    tree = draft.tree
    pending = target.sync(history)
    m = len(pending)
    block = TreeBlock(target)
    parents = list(range(-1, m - 1)) + [m - 1 if p < 0 else m + p for p in tree.parents]
    logits = block.forward(pending + tree.tokens, parents, policy.cost.pad_width(m + len(tree)))[m - 1:]
    contexts = None
    if params.uses_context:
        contexts = [history] + [history + [tree.tokens[j] for j in tree.path(i)] for i in range(len(tree))]
    if params.greedy and coupling is None:  # the argmax of the processed logits (sampling.greedy_scores)
        scores = greedy_scores(logits, params, contexts)
        lp = lazy_normalised(scores)
    else:
        lp = process_logits(logits, params, contexts)
    finite = mx.isfinite(logits.sum())
    if coupling is not None:  # row 0 is position len(history); the row after node j, len(history) + its depth
        best = coupling.choose(lp, [len(history)] + [len(history) + tree.depth(j) for j in range(len(tree))])
        mx.eval(best, finite)
    elif params.greedy:
        best = mx.argmax(scores, axis=-1)
        tie = near_ties(logits, scores, best)
        mx.eval(best, finite, tie)
    else:
        p = cpu.probabilities(lp)
        mx.eval(p, finite)
    if not finite.item():
        raise MlxspecError(f"{target_name} produced NaN/inf logits: its weights are corrupt or overflow "
                           "in this dtype; re-convert or re-download it")
    ties = None
    if params.greedy or coupling is not None:  # coupled: walk the target's argmax(log p + g)
        path, nxt = walk_greedy(tree, best.tolist())
        if params.greedy and coupling is None:
            flags = tie.tolist()
            ties = [flags[0]] + [flags[1 + j] for j in path]  # the rows that chose each emitted token
    else:
        path, nxt = tree_acceptance.walk_sample(tree, np.array(p, dtype=np.float64), np.random.default_rng(_seed(k_verify)))
    block.commit(list(range(m)) + [m + j for j in path])
    draft.commit(path)
    return TreeResult(len(tree), tree.max_depth, [tree.tokens[j] for j in path], nxt,
                      _outcomes(tree, draft, path, policy), sum(tree.rank[j] > 0 for j in path),
                      sum(tree.lookup[j] for j in path), budget, draft_time, ties, lp, [0] + [1 + j for j in path])


def _outcomes(tree, draft: TreeDraft, path: list, policy) -> list:
    """What the round says about the draft: for each node the walk passed (root
    first), whether its first child was taken -- (confidence, kept) as for chains;
    an expanded node none of whose children was worth verifying counts as a refused
    draft; its later siblings (taken or not) update the sibling scale."""
    out = []
    for i, node in enumerate([-1] + path):
        kids = tree.children(node)
        taken = path[i] if i < len(path) else None
        if not kids:
            if node in draft.expanded:
                out.append(("refused", False))
            break
        first = kids[0]
        out.append((tree.confidence[first], taken == first))
        if tree.lookup[first] and tree.confidence[first] is not None:  # the draft agreed: the lookup's outcome too
            out.append((None, taken == first))
        out.extend((None, taken == c) for c in kids[1:] if tree.lookup[c])  # lookup branches
        later = [c for c in kids[1:] if not tree.lookup[c]]
        if later and hasattr(policy, "update_siblings"):
            predicted = sum(tree.draft_p[c] for c in later)  # what the draft gave them
            policy.update_siblings(predicted, int(taken in later))
        if taken is None:
            break
    return out
