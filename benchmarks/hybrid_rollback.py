"""What a rejection costs on a hybrid (gated delta-net) target, and the speed-up that follows.

    python benchmarks/hybrid_rollback.py                 # Qwen3.5-0.8B text layout, random weights, float32
    python benchmarks/hybrid_rollback.py --quick         # a small model, 1 repeat, k=4: a smoke run (~1 min)

The target is mlx_lm's qwen3_5 model with the Qwen3.5-0.8B text layout (24 layers,
18 gated delta-net + 6 gated attention, 0.75 B parameters) and random weights, in
float32.  Two parts, both interleaved (every repeat runs every contender, in an
order rotated by the repeat), after one discarded warm-up, --repeats times; each
figure is the median with its range:

1. rounds of k drafts (--k), by where the first rejection falls.  A round with j
   drafts kept, then one rejected, rolls the recurrent layers back to the
   checkpoint before its pass, so the NEXT pass also feeds the j + 1 tokens the
   round produced (core/recurrent.py).  Timed: the verify pass, plus the next pass,
   against a fully accepted round (j = k) and a plain step; and the alternative
   mechanism, an eager extra pass over the j + 1 tokens right after the rejection.
2. speculation with a drafter whose acceptance is set: an oracle that knows the
   target's greedy continuation and proposes a wrong token with probability 1 - a
   (a = 0.5, 0.7, 0.9), costing nothing, against plain decoding, with fixed k
   (--ks) and with `auto` (the per-token policy on the calibrated costs, re-feed
   priced in); each fixed-k speed-up is printed beside the cost model's prediction
   (`cost_model.predicted_speedup`: re-fed runs piling up over back-to-back
   rejections, `refeed_chain`) and the previous one (one rejection's re-feed alone),
   and the re-fed positions per pass beside the chain's (`expected_refed`); each
   `auto` row says what it drafted (drafts per round, the share of plain tokens,
   the most common lengths) and the chain's best fixed k at that acceptance.

Writes every figure to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402,F401  (sets up the MLX backend first)
import mlx.core as mx  # noqa: E402

from mlxspec.core.cache import ModelState  # noqa: E402
from mlxspec.costs.cost_model import calibrate, expected_refed, merge_limit, predicted_speedup, refeed_cost
from mlxspec.costs.draft_length import FixedK, PerToken, Round  # noqa: E402
from mlxspec.core.recurrent import state_arrays  # noqa: E402
from mlxspec.drafting.drafters import Drafter, Proposal  # noqa: E402
from mlxspec.decoder import SpeculativeDecoder  # noqa: E402
from mlxspec.core.stats import GenerationStats  # noqa: E402

LAYOUTS = {
    # Qwen3.5-0.8B's text model (config.json text_config), vocabulary included
    "full": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=256, vocab_size=248320, linear_num_value_heads=16,
                 linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                 tie_word_embeddings=True),
    "quick": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=1000, linear_num_value_heads=4,
                  linear_num_key_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                  tie_word_embeddings=True),
}


def build(layout: str):
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    cfg = {"model_type": "qwen3_5", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
           "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
           "rope_parameters": {"type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
           **LAYOUTS[layout]}
    model_cls, args_cls = _get_classes(cfg)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(cfg))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model, cfg, sum(v.size for _, v in tree_flatten(model.parameters()))


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}


def interleaved(contenders: dict, repeats: int) -> dict:
    """name -> seconds per run; one discarded warm-up each, then rotated order per repeat."""
    for fn in contenders.values():
        fn()
    times = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - t0)
    return times


# -- part 1: the cost of a round by where its first rejection falls -----------------------------

def rounds(model, vocab: int, k: int, context: int, repeats: int) -> dict:
    rng = random.Random(0)
    prompt = [rng.randrange(10, vocab) for _ in range(context)]
    drafts = [rng.randrange(10, vocab) for _ in range(2 * k + 2)]

    def argmax(logits):
        mx.eval(mx.argmax(logits, axis=-1))

    def plain():
        st = ModelState(model)
        st.prefill(prompt)
        t0 = time.perf_counter()
        argmax(st.forward(st.sync(prompt)))
        return time.perf_counter() - t0

    def round_then_next(j):
        """(verify pass, next pass) seconds: j drafts kept of k (j = k: all)."""
        st = ModelState(model)
        st.prefill(prompt)
        history = list(prompt)
        t0 = time.perf_counter()
        argmax(st.forward(st.sync(history) + drafts[:k]))
        t1 = time.perf_counter()
        history += drafts[:j] + [drafts[k]]  # j kept, then the target's own token
        argmax(st.forward(st.sync(history) + drafts[k + 1: 2 * k + 1]))
        return t1 - t0, time.perf_counter() - t1

    def eager(j):
        """The alternative: right after the rejection, one extra pass over the j + 1 tokens."""
        st = ModelState(model)
        st.prefill(prompt)
        history = list(prompt)
        argmax(st.forward(st.sync(history) + drafts[:k]))
        history += drafts[:j] + [drafts[k]]
        t0 = time.perf_counter()
        pending = st.sync(history)
        st.forward(pending[:-1])
        mx.eval(state_arrays(st.cache))
        return time.perf_counter() - t0

    out = {}
    contenders = {"plain": lambda: out.setdefault("plain", []).append(plain())}
    for j in range(k + 1):
        contenders[f"j={j}"] = lambda j=j: out.setdefault(f"j={j}", []).append(round_then_next(j))
        if j < k:
            contenders[f"eager j={j}"] = lambda j=j: out.setdefault(f"eager j={j}", []).append(eager(j))
    interleaved(contenders, repeats)
    return {name: runs[1:] for name, runs in out.items()}  # drop the warm-up


# -- part 2: a drafter whose acceptance is set --------------------------------------------------

class OracleDrafter(Drafter):
    """Proposes the target's own greedy continuation (known in advance), each token
    replaced by a wrong one with probability 1 - a: the acceptance is a, per token."""

    name = "oracle"
    max_k = 16
    relative_cost = 0.0

    def __init__(self, reference: list[int], acceptance: float, vocab: int, seed: int = 0):
        self.reference, self.a, self.vocab = reference, acceptance, vocab
        self.rng = random.Random(seed)

    def propose(self, history, k, params, key, rnd=None):
        rnd = rnd if rnd is not None else Round(None, k)
        out = []
        for tok in self.reference[len(history): len(history) + k]:
            if not (rnd.more(0.0, lookup=True) and rnd.offer(None, 0.0)):
                break
            out.append(tok if self.rng.random() < self.a else (tok + 1) % self.vocab)
        return Proposal(out, None, [None] * len(out))


def one_rejection_prediction(cm, a: float, k: int) -> float:
    """The previous model: each rejection re-feeds only its own round's j + 1 positions."""
    time = k * cm.draft_step + cm.verify_width(k + 1)
    time += sum(a ** j * (1 - a) * refeed_cost(cm, j + 1) for j in range(k))
    return sum(a ** i for i in range(k + 1)) / time


def speedups(model, vocab: int, context: int, tokens: int, ks, accepts, repeats: int) -> dict:
    rng = random.Random(1)
    prompt = [rng.randrange(10, vocab) for _ in range(context)]
    ref = list(prompt)
    list(SpeculativeDecoder(model).generate(ref, max_tokens=tokens + 20))
    cm = calibrate(model, OracleDrafter(ref, 1.0, vocab), vocab)
    runs: dict = {}

    def run(name, drafter, k):
        stats = GenerationStats()
        h = list(prompt)
        if k == "auto":  # as the API builds it for a hybrid target (api.make_policy), on these costs
            policy = PerToken(cm, min(12, drafter.max_k), lookup=True, model=False, refeed=True)
        else:
            policy = FixedK(k)
        dec = SpeculativeDecoder(model, drafter, policy)
        dec.target.merge_limit = merge_limit(cm)  # as `auto` sets it, and as the prediction assumes
        list(dec.generate(h, max_tokens=tokens, stats=stats))
        runs.setdefault(name, []).append({"tps": stats.generation_tps, "acceptance": stats.acceptance_rate,
                                          "refed": stats.refed_positions, "passes": stats.target_passes,
                                          "lengths": stats.k_history, "plain_tokens": stats.tokens_plain,
                                          "tokens": stats.generated_tokens, "notes": stats.notes,
                                          "identical": h == ref[: len(h)]})

    contenders = {"plain": lambda: run("plain", None, 0)}
    for a in accepts:
        for k in list(ks) + ["auto"]:
            name = f"a={a} k={k}" if k != "auto" else f"a={a} auto"
            contenders[name] = lambda a=a, k=k, name=name: run(
                name, OracleDrafter(ref, a, vocab, seed=len(runs.get(name, []))), k)
    interleaved(contenders, repeats)
    runs = {name: r[1:] for name, r in runs.items()}
    plain_tps = [r["tps"] for r in runs["plain"]]
    table = {}
    for a in accepts:
        for k in list(ks) + ["auto"]:
            name = f"a={a} k={k}" if k != "auto" else f"a={a} auto"
            rs = runs[name]
            row = {
                "speedup": spread([r["tps"] / p for r, p in zip(rs, plain_tps)]),
                "acceptance": statistics.mean(r["acceptance"] for r in rs),
                "identical_to_plain": all(r["identical"] for r in rs),
                "refed_per_pass": statistics.mean(r["refed"] / r["passes"] for r in rs),
            }
            if k == "auto":
                lengths = [n for r in rs for n in r["lengths"]]
                best = max(range(1, 13), key=lambda j: predicted_speedup(cm, a, j, refeed=True))
                row.update({"drafts_per_round": statistics.mean(lengths),
                            "plain_share": sum(r["plain_tokens"] for r in rs) / sum(r["tokens"] for r in rs),
                            "lengths": dict(sorted(Counter(lengths).items())),
                            "notes": sorted({n for r in rs for n in r["notes"]}),
                            "best_fixed_k": best, "best_fixed_predicted": predicted_speedup(cm, a, best, refeed=True)})
            else:
                row.update({"refed_per_pass_predicted": expected_refed(cm, a, k),
                            "predicted": predicted_speedup(cm, a, k, refeed=True),
                            "predicted_one_rejection": one_rejection_prediction(cm, a, k),
                            "predicted_without_refeed": predicted_speedup(cm, a, k, refeed=False)})
            table[name] = row
    return {"cost_model": cm.to_dict(), "merge_limit": merge_limit(cm), "plain_tps": spread(plain_tps), "runs": table}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: a small model, short runs, 1 repeat, k=4 only (checks the script works)")
    ap.add_argument("--k", type=int, default=4, help="drafts per round in part 1")
    ap.add_argument("--ks", default=None, help="fixed draft lengths in part 2 (default 2,4,6; --quick 4)")
    ap.add_argument("--accepts", default="0.5,0.7,0.9")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3; --quick 1)")
    ap.add_argument("--context", type=int, default=256, help="prompt tokens before the timed rounds")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per run in part 2 (default 64; --quick 24)")
    ap.add_argument("--out", default="hybrid_rollback.json")
    o = ap.parse_args(argv)
    repeats = o.repeats or (1 if o.quick else 3)
    tokens = o.tokens or (24 if o.quick else 64)
    context = 32 if o.quick and o.context == 256 else o.context
    model, cfg, n_params = build("quick" if o.quick else "full")
    vocab = cfg["vocab_size"]
    print(f"qwen3_5 {'quick' if o.quick else 'Qwen3.5-0.8B'} layout: {n_params / 1e6:.0f} M parameters, float32, "
          f"{backend_name()}; {repeats} repeats, context {context}")

    part1 = rounds(model, vocab, o.k, context, repeats)
    plain = statistics.median(part1["plain"])
    full = statistics.median(sum(part1[f"j={o.k}"][i]) for i in range(len(part1[f"j={o.k}"])))
    print(f"\n1. rounds of k={o.k} drafts (seconds, then relative to a plain step of {1000 * plain:.1f} ms):")
    print(f"   {'first rejection':<22}{'verify pass':>12}{'next pass':>12}{'both / plain':>16}"
          f"{'re-fed cost':>14}{'eager pass':>14}")
    for j in range(o.k + 1):
        v = [x for x, _ in part1[f"j={j}"]]
        n = [y for _, y in part1[f"j={j}"]]
        both = [x + y for x, y in part1[f"j={j}"]]
        refed = statistics.median(n) - statistics.median([y for _, y in part1[f"j={o.k}"]])
        eager = statistics.median(part1[f"eager j={j}"]) / plain if j < o.k else float("nan")
        label = "none (all kept)" if j == o.k else f"after {j} kept"
        print(f"   {label:<22}{statistics.median(v):>12.4f}{statistics.median(n):>12.4f}"
              f"{statistics.median(both) / plain:>10.2f} [{min(both) / plain:.2f}-{max(both) / plain:.2f}]"
              f"{refed / plain:>12.2f}{eager:>14.2f}")
    print(f"   (re-fed cost: the next pass's extra time for the j + 1 re-fed positions; eager pass: the "
          f"alternative extra pass; a fully accepted round and its next pass: {full / plain:.2f} plain steps)")

    ks = [int(x) for x in (o.ks or ("4" if o.quick else "2,4,6")).split(",")]
    accepts = [float(x) for x in o.accepts.split(",")]
    part2 = speedups(model, vocab, context, tokens, ks, accepts, repeats)
    print(f"\n2. speed-up over plain decoding with a drafter kept with probability a (plain "
          f"{part2['plain_tps']['median']:.2f} tok/s); verify costs by width 1..9: "
          f"{json.dumps(part2['cost_model']['verify'][:9])}, re-fed positions ride along up to "
          f"{part2['merge_limit']}")
    print(f"   {'run':<14}{'kept/drafted':>13}{'re-fed/pass':>13}{'(chain)':>9}{'measured':>22}{'predicted':>11}"
          f"{'(old: one rejection)':>22}{'(no re-feed)':>14}  identical")
    for name, r in part2["runs"].items():
        s = r["speedup"]
        measured = f"{s['median']:>10.2f} [{s['min']:.2f}-{s['max']:.2f}]"
        if "predicted" in r:
            print(f"   {name:<14}{r['acceptance']:>13.2f}{r['refed_per_pass']:>13.2f}"
                  f"{r['refed_per_pass_predicted']:>9.2f}{measured:>22}{r['predicted']:>11.2f}"
                  f"{r['predicted_one_rejection']:>22.2f}{r['predicted_without_refeed']:>14.2f}  {r['identical_to_plain']}")
        else:
            lengths = ", ".join(f"{n}: {c}" for n, c in sorted(r["lengths"].items(), key=lambda x: -x[1])[:4])
            print(f"   {name:<14}{r['acceptance']:>13.2f}{r['refed_per_pass']:>13.2f}{'':>9}{measured:>22}"
                  f"{'':>11}{'':>22}{'':>14}  {r['identical_to_plain']}")
            print(f"   {'':<14}auto drafted {r['drafts_per_round']:.2f} per round, {100 * r['plain_share']:.0f} % of "
                  f"tokens plain; lengths (length: rounds) {lengths}; the chain's best fixed k: "
                  f"{r['best_fixed_k']} ({r['best_fixed_predicted']:.2f}x)")
            for note in r["notes"]:
                print(f"   {'':<14}note: {note}")
    Path(o.out).write_text(json.dumps({"layout": "quick" if o.quick else "Qwen3.5-0.8B", "params": n_params,
                                       "machine": platform.platform(), "k": o.k, "context": context,
                                       "part1": part1, "part2": part2}, indent=1))
    print(f"\nwrote {o.out}")


def backend_name() -> str:
    from mlxspec.device import describe

    return describe()


if __name__ == "__main__":
    main()
