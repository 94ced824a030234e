"""The lossless core on the Mac's path, run by tests/test_mac_path.py in ONE subprocess
with MLXSPEC_CPU_KERNELS=0 (the switch is read when mlxspec is imported and models
load, so a process of its own is the robust way): no Linux CPU kernel anywhere, on
4-bit quantized mlx-lm models (nn.quantize, group sizes 32 and 64) and on float16 /
bfloat16 activations.  Prints one JSON object, the figures each test asserts on.

    MLXSPEC_CPU_KERNELS=0 python tests/mac_path_checks.py [CHECK ...]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlxspec  # noqa: F401,E402  (before mlx.core)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

import tiny_models  # noqa: E402
from mlxspec.core import acceptance  # noqa: E402
from mlxspec.core.cache import ModelState  # noqa: E402
from mlxspec.core.sampling import SamplingParams  # noqa: E402
from mlxspec.core.stats import GenerationStats  # noqa: E402
from mlxspec.costs.cost_model import assumed  # noqa: E402
from mlxspec.costs.draft_length import FixedK, PerToken  # noqa: E402
from mlxspec.decoder import SpeculativeDecoder  # noqa: E402
from mlxspec.drafting.drafters import ModelDrafter  # noqa: E402

# name -> (4-bit group size or None, activation dtype)
CONFIGS = {"q64": (64, "float32"), "q32-float16": (32, "float16"), "float16": (None, "float16"),
           "bfloat16": (None, "bfloat16"), "q32": (32, "float32")}
MAX_TOKENS = 16
ARCH = {"q64": "llama", "q32-float16": "qwen2", "float16": "llama", "bfloat16": "qwen2"}  # one each: CI time


def convert(model, config: str):
    """`model` in place: 4-bit quantized (QuantizedLinear / QuantizedEmbedding) and/or cast."""
    group, dtype = CONFIGS[config]
    model.set_dtype(getattr(mx, dtype))
    if group:
        nn.quantize(model, group_size=group, bits=4)
    mx.eval(model.parameters())
    return model


def tiny_pair(arch: str, config: str, **cfg_kw):
    cfg = tiny_models.config_for(arch, **cfg_kw)
    target = tiny_models.build(cfg, seed=11, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=5)
    return convert(target, config), convert(draft, config)


def policies():
    return {"chain-k4": (lambda: FixedK(4), False),
            "chain-auto": (lambda: PerToken(assumed(0.05), 8), False),
            "tree": (lambda: PerToken(assumed(0.05, slope=0.0, width=40), 6), True)}


def run(decoder, prompt, stats=None, max_tokens=MAX_TOKENS):
    return [t for t, _ in decoder.generate(list(prompt), max_tokens=max_tokens, stats=stats)]


def first_divergence(a: list, b: list):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def greedy_figures(target, draft, prompts) -> dict:
    """Speculative (chains and trees) vs plain greedy: divergences, and how many fell on
    a position the speculative run did not count as a near-tie (must be none)."""
    out = dict(runs=0, tokens=0, divergences=0, undetected=0, near_ties=0, plain_near_ties=0, tree_rounds=0,
               accepted=0, rejected=0)
    for prompt in prompts:
        ps = GenerationStats()
        plain = run(SpeculativeDecoder(target), prompt, ps)
        out["plain_near_ties"] += ps.near_ties
        for make, tree in policies().values():
            st = GenerationStats()
            got = run(SpeculativeDecoder(target, ModelDrafter(draft), make(), tree=tree), prompt, st)
            out["runs"] += 1
            out["tokens"] += len(got)
            out["near_ties"] += st.near_ties
            out["tree_rounds"] += st.tree_rounds
            out["accepted"] += st.draft_accepted
            out["rejected"] += st.draft_proposed - st.draft_accepted
            j = first_divergence(plain, got)
            if j is None and len(plain) != len(got):
                j = min(len(plain), len(got))
            if j is not None:
                out["divergences"] += 1
                out["undetected"] += j not in st.near_tie_positions
    return out


def prompts(seed: int, n: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, 299, size=int(rng.integers(2, 12))).tolist() for _ in range(n)]


def check_greedy() -> dict:
    """Greedy equality on every quantized / 16-bit configuration, llama and qwen2."""
    res = {}
    for config in ARCH:
        target, draft = tiny_pair(ARCH[config], config)
        res[config] = greedy_figures(target, draft, prompts(1, 2))
    return res


class RoundsUnlikeOnePosition:
    """Makes `model`'s passes over several positions round differently from its
    one-position steps, as a GPU's batched kernels may: every logit of such a pass
    (after the prompt's: verify passes) is moved by a random whole number of units in
    the last place (at most `ulps`), in its own dtype.  A few ulps is within the dtype's
    rounding (a flip needs a top-2 gap of at most 2 * ulps units); thousands are not."""

    def __init__(self, model, ulps: int, seed: int = 0):
        self.model, self.ulps, self.rng = model, ulps, np.random.default_rng(seed)
        self.cls = type(model)
        outer = self

        def call(this, inputs, *a, **kw):
            out = outer.cls.__call__(this, inputs, *a, **kw)
            cache = kw.get("cache") or (a[0] if a else None)
            prefill = not cache or not getattr(cache[0], "offset", 0) or cache[0].offset <= inputs.shape[-1]
            return outer.perturb(out) if inputs.shape[-1] > 1 and not prefill else out

        model.__class__ = type(f"Perturbed{self.cls.__name__}", (self.cls,), {"__call__": call})

    def perturb(self, out):
        dt = out.dtype
        x = out.astype(mx.float32)
        eps = acceptance.EPS[str(dt).rpartition(".")[2]]
        ulp = mx.power(2.0, mx.floor(mx.log2(mx.maximum(mx.abs(x), 2.0 ** -14)))) * eps
        k = mx.array(self.rng.integers(-self.ulps, self.ulps + 1, size=x.shape).astype(np.float32))
        return (x + k * ulp).astype(dt)

    def undo(self):
        self.model.__class__ = self.cls


def check_near_ties() -> dict:
    """Verify passes that round unlike one-position steps: within the dtype's rounding
    (3 ulps) every divergence falls on a counted near-tie; the control, moved by far more
    than rounding (4096 ulps), must produce a divergence the counter did not flag."""
    res = {}
    for config, label, ulps, n in (("float16", "within", 3, 4), ("bfloat16", "within", 3, 3),
                                   ("q32-float16", "within", 3, 1), ("float16", "beyond", 4096, 1),
                                   ("q32-float16", "beyond", 4096, 1)):
        target, draft = tiny_pair(ARCH[config], config)
        noisy = RoundsUnlikeOnePosition(target, ulps, seed=3)
        try:
            res[f"{config}/{label}"] = greedy_figures(target, draft, prompts(2, n))
        finally:
            noisy.undo()
    return res


SAMPLES, CONTROL_SAMPLES = 300, 600  # sound p 0.16 at 300; the control fails at p 8e-7 at 600 (threshold 1e-3), these seeds


def check_sampling() -> dict:
    """Exact speculative sampling (chi-square over 3-token sequences, the harness of
    tests/test_sequence_distribution.py) on a 4-bit and a float16 pair, and the broken
    residual control, which must fail."""
    import test_sequence_distribution as sd

    res = {}
    config = os.environ.get("MAC_PATH_SAMPLING", "q32")  # 4-bit weights (float16 ones: CPU float16 is slow)
    cfg = tiny_models.config_for("llama", vocab_size=sd.V, hidden=32, ffn=64)
    target = convert(tiny_models.build(cfg, seed=3, scale=1.5), config)
    draft = convert(tiny_models.build(cfg, seed=4, scale=1.5), config)
    probs = sd.exact_sequence_probs(target, sd.PARAMS)
    counts, accepted = sd.sample_sequences(target, draft, sd.PARAMS, samples=SAMPLES)
    _, df, p = sd.chi_square(counts, probs, SAMPLES)
    res[config] = dict(p=p, df=df, accepted=accepted, samples=SAMPLES, total_prob=sum(probs.values()))
    original = acceptance.residual
    acceptance.residual = lambda p, q, draft: p  # the classic bug: resample from p after a rejection
    try:
        counts, _ = sd.sample_sequences(target, draft, sd.PARAMS, samples=CONTROL_SAMPLES)
    finally:
        acceptance.residual = original
    res["broken-residual"] = dict(p=sd.chi_square(counts, probs, CONTROL_SAMPLES)[2], samples=CONTROL_SAMPLES)
    return res


def cache_mismatch(state: ModelState, history) -> str | None:
    """None when `state` holds exactly history[:-1] and its keys/values equal a fresh
    prefill of them (to a few units of the cache's dtype), else what differs."""
    kept = history[:-1]
    if state.tokens != kept:
        return f"tokens {state.tokens} != {kept}"
    fresh = ModelState(state.model)
    fresh.forward(kept)
    mx.eval([c.state for c in fresh.cache])
    for got, want in zip(state.cache, fresh.cache):
        if not got.offset == want.offset == len(kept):
            return f"offsets {got.offset} {want.offset} {len(kept)}"
        for a, b in zip((got.keys, got.values), (want.keys, want.values)):
            eps = acceptance.EPS[str(a.dtype).rpartition(".")[2]]
            a = np.array(a[..., : len(kept), :].astype(mx.float32))
            b = np.array(b[..., : len(kept), :].astype(mx.float32))
            tol = 8 * eps * max(1.0, float(np.abs(b).max(initial=0.0)))
            if np.abs(a - b).max(initial=0.0) > tol:
                return f"cache differs by {np.abs(a - b).max()} > {tol}"
    return None


def check_caches() -> dict:
    """After random accept/reject patterns (fixed k 1..6, drafts of three qualities,
    greedy and sampled), both caches equal a fresh prefill of the kept tokens."""
    rng = np.random.default_rng(7)
    res = {}
    for config in ("q64", "float16"):
        cfg = tiny_models.config_for("qwen2")
        target = tiny_models.build(cfg, seed=21, scale=3.0)
        drafts = [convert(tiny_models.perturbed(target, cfg, noise=n, seed=2), config) for n in (0.0, 0.01, 0.05)]
        convert(target, config)
        bad, runs = [], 0
        for _ in range(12):
            prompt = rng.integers(5, 299, size=int(rng.integers(1, 12))).tolist()
            drafter = ModelDrafter(drafts[int(rng.integers(0, 3))])
            dec = SpeculativeDecoder(target, drafter, FixedK(int(rng.integers(1, 7))))
            history = list(prompt)
            params = SamplingParams(temp=float(rng.choice([0.0, 1.0])), seed=1)
            list(dec.generate(history, params, max_tokens=int(rng.integers(1, 15))))
            drafter.prefill(history)  # the drafter catches up lazily, at its next proposal
            runs += 1
            for state in (dec.target, drafter.state):
                why = cache_mismatch(state, history)
                if why:
                    bad.append(why)
        res[config] = dict(runs=runs, mismatches=bad)
    return res


def save_pair(root: Path, config: str) -> tuple[Path, Path]:
    """A tiny qwen2 pair as model folders, 4-bit quantized in the folders themselves
    (config.json's "quantization", as mlx_lm.convert writes) when `config` says so."""
    group, _ = CONFIGS[config]
    cfg = tiny_models.config_for("qwen2")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=0.01, seed=1)
    over = None
    if group:
        for m in (target, draft):
            nn.quantize(m, group_size=group, bits=4)
        over = {"quantization": {"group_size": group, "bits": 4}}
    t = tiny_models.save_model_dir(root / f"{config}-target", "qwen2", model=target, cfg_overrides=over)
    d = tiny_models.save_model_dir(root / f"{config}-draft", "qwen2", model=draft, cfg_overrides=over)
    return t, d


def check_session() -> dict:
    """A Session's second turn on a 4-bit pair loaded with dtype="float16": both replies
    are the target's plain greedy output of the whole history (or diverge at a counted
    near-tie), and the second turn feeds only its new text."""
    from mlxspec.session import Session

    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        t, d = save_pair(Path(tmp), "q64")
        pair = mlxspec.load(t, d, dtype="float16")
        res["describe"] = pair.describe()
        res["quantized"] = any(isinstance(m, nn.QuantizedLinear) for _, m in pair.target.named_modules())
        s = Session(pair, chat_template=False, max_tokens=8, num_draft=2)
        first = s.send("Once upon")
        stream = s.stream(" and then")
        for _ in stream:
            pass
        history = list(stream.prompt_tokens)
        plain = mlxspec.generate(pair, list(history), max_tokens=8, drafter="none").tokens
        j = first_divergence(plain, stream.reply.tokens)
        res.update(first_tokens=len(first.tokens), second_tokens=len(stream.reply.tokens),
                   second_ok=j is None and plain == stream.reply.tokens or j in stream.reply.stats.near_tie_positions,
                   processed=stream.prompt_tokens_processed, history=len(history),
                   history_ok=s.tokens == history + stream.reply.tokens
                   and history[: len(s.tokens) - len(stream.reply.tokens) - 3] == (
                       s.tokens[: len(history) - 3]))
    return res


CHECKS = {"greedy": check_greedy, "near_ties": check_near_ties, "sampling": check_sampling,
          "caches": check_caches, "session": check_session}


def main(names) -> dict:
    out = {"kernels_off": os.environ.get("MLXSPEC_CPU_KERNELS") == "0",
           "device": str(mx.default_device()), "seconds": {}}
    from mlxspec import cpu

    out["layout"] = cpu.layout(tiny_models.make_model("llama"))
    for name in names or CHECKS:
        t0 = time.perf_counter()
        out[name] = CHECKS[name]()
        out["seconds"][name] = round(time.perf_counter() - t0, 1)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
