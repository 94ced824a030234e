"""Tiny targets on which the model-free drafters have something to find, for the
losslessness tests (random tiny models never repeat themselves and have no
redundant layers, so lookup and layer-skip drafts would almost all be rejected
and the acceptance paths would go untested)."""

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

import tiny_models
from mlxspec.drafting.drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from mlxspec.drafting.hybrid import HybridDrafter
from mlxspec.drafting.vocab_subset import SubsetHead

SKIPPED = 1  # the layer the layer-skip draft leaves out of a 3-layer target


def _damp(model, names, factor):
    flat = [(k, v * factor if any(n in k for n in names) else v) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    mx.eval(model.parameters())
    return model


def lookup_target(arch, seed=11, damp=0.005, **cfg_kw):
    """Attention outputs damped: the next token depends mostly on the current one, so
    on a prompt that quotes the target's own continuation (`grounded_prompt`) the
    n-gram lookups are often, not always, right (about half of the drafts kept)."""
    cfg = tiny_models.config_for(arch, **cfg_kw)
    return _damp(tiny_models.build(cfg, seed=seed, scale=3.0), ["self_attn.o_proj"], damp)


def grounded_prompt(target, prompt, n=12):
    """prompt + the target's greedy continuation of it + prompt again: input-grounded
    text, where what follows is (nearly) something already seen."""
    from mlxspec.decoder import SpeculativeDecoder

    cont = [t for t, _ in SpeculativeDecoder(target).generate(list(prompt), max_tokens=n)]
    return list(prompt) + cont + list(prompt)


def layerskip_target(arch, seed=11, **cfg_kw):
    """Three layers, the middle one nearly redundant (its outputs damped): skipping it
    usually, not always, gives the same next token."""
    cfg = tiny_models.config_for(arch, **{"layers": 3, **cfg_kw})
    prefix = f"layers.{SKIPPED}."
    return _damp(tiny_models.build(cfg, seed=seed, scale=3.0),
                 [prefix + "self_attn.o_proj", prefix + "mlp.down_proj"], 0.15)


def subset_ids(vocab_size):
    """A pruned draft vocabulary: two thirds of the ids (so some of the target's
    choices are never proposed, and both paths are exercised)."""
    return [i for i in range(vocab_size) if i % 3 != 0]


def subset_drafter(draft, vocab_size=tiny_models.DEFAULT_VOCAB, ids=None):
    return ModelDrafter(draft, subset=SubsetHead(draft, ids or subset_ids(vocab_size), vocab_size))


def make(kind, target, draft=None):
    """A fresh drafter of `kind` for `target` ('model', 'subset' and 'hybrid' need `draft`)."""
    if kind == "model":
        return ModelDrafter(draft)
    if kind == "subset":
        return subset_drafter(draft)
    if kind == "hybrid":
        return HybridDrafter(PromptLookupDrafter(), ModelDrafter(draft))
    if kind == "lookup":
        return PromptLookupDrafter()
    if kind == "layerskip":
        n = len(target.model.layers)
        return LayerSkipDrafter(target, keep=[i for i in range(n) if i != SKIPPED])
    raise ValueError(kind)
