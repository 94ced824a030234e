"""What 4-bit draft weights (MLXSPEC_DRAFT_BITS=4, mlxspec/cpu/draft_gemm4.c) gain over the default
int8 ones (cpu/draft_gemm.c).

    python benchmarks/draft_bits.py                  # the code suite, 64 tokens, 3 repeats
    python benchmarks/draft_bits.py --agreement      # how often each draft's first choice is the target's token

One process, the default pair loaded once, and its draft loaded a second time with
4-bit weights beside the default int8 one.  Timing: plain decoding, the default
(token trees) and chains, and trees and chains with the 4-bit draft, interleaved on each prompt, warm, in a rotating order
per repeat (each draft calibrated on its own); decode tok/s, run-by-run ratios,
tokens per target pass, and whether every greedy output is identical (it must be:
the draft only proposes).  Agreement: along the target's own greedy output (64
tokens per prompt of the code and chat suites), the share of positions where each
draft's argmax is the target's token -- what rounding the draft's weights can cost.
Needs the pair pulled.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlxspec.cpu import draft_weights, packed_weights
from mlxspec.models import loading  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import ROOT, arguments, contender_comparison, spread  # noqa: E402

RATIOS = ["trees 4-bit / trees", "chains 4-bit / chains", "trees / plain", "trees 4-bit / plain",
          "trees 4-bit / chains 4-bit", "chains 4-bit / trees"]


def four_bit_pair(pair):
    """The pair with its draft loaded again, 4-bit weights where they fit."""
    old = os.environ.get(draft_weights.BITS_ENV)
    os.environ[draft_weights.BITS_ENV] = "4"
    try:
        draft = loading.load_model_dir(pair.draft_path, "draft")[0]
    finally:
        if old is None:
            del os.environ[draft_weights.BITS_ENV]
        else:
            os.environ[draft_weights.BITS_ENV] = old
    return dataclasses.replace(pair, draft=draft, subset_ids={})


def contenders(pair4) -> dict:
    from mlxspec.bench.contenders import MlxspecContender, make_contender

    class On(MlxspecContender):  # runs on the 4-bit pair whatever pair it is given
        def run(self, pair, ids, **kw):
            return super().run(pair4, ids, **kw)

    return {"plain": make_contender("plain"), "trees": make_contender("model:auto"),
            "trees 4-bit": On("trees 4-bit", num_draft="auto"), "chains": make_contender("model:auto:chain"),
            "chains 4-bit": On("chains 4-bit", num_draft="auto", tree=False)}


def agreement(pair, pair4, max_tokens: int) -> int:
    import json

    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec import api

    drafts = {"int8": pair.draft, "4-bit": pair4.draft}
    got = {k: [] for k in drafts}
    for suite in ("code", "chat"):
        for p in json.loads((ROOT / f"benchmarks/suites/{suite}.json").read_text())["prompts"]:
            ids = api.encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
            out = list(api.generate(pair, ids, max_tokens=max_tokens, drafter="none").tokens)
            full, n0 = ids + out, len(ids)
            for name, model in drafts.items():
                logits = model(mx.array([full[:-1]]), cache=make_prompt_cache(model))[0, n0 - 1:]
                got[name].append(float((np.array(mx.argmax(logits, axis=-1)) == np.array(out)).mean()))
            print(f"{suite}/{p['id']}", " ".join(f"{k} {v[-1]:.3f}" for k, v in got.items()), flush=True)
    for name, v in got.items():
        s = spread(v)
        print(f"{name}: mean {np.mean(v):.4f}, median {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}, n={s['n']})")
    return 0


def main() -> int:
    def extra(ap):
        ap.add_argument("--agreement", action="store_true")
        ap.add_argument("--contenders", default="", help="a comma-separated subset of the contenders (default: all)")

    args = arguments(__doc__, "0", 64, "draft-bits.json", extra=extra)
    pair = mlxspec.load()
    pair4 = four_bit_pair(pair)
    if "i4" not in packed_weights.layout(pair4.draft) or "i4" in packed_weights.layout(pair.draft):
        print("needs the default int8 draft and the 4-bit kernel (AVX-512 VNNI); unset MLXSPEC_DRAFT_BITS",
              file=sys.stderr)
        return 2
    if args.agreement:
        return agreement(pair, pair4, args.max_tokens)
    chosen = contenders(pair4)
    if args.contenders:
        names = [n.strip() for n in args.contenders.split(",")]
        unknown = [n for n in names if n not in chosen]
        if unknown:
            print(f"no contender {unknown[0]!r}: choose from {', '.join(chosen)}", file=sys.stderr)
            return 2
        chosen = {n: chosen[n] for n in names}
    ratios = [r for r in RATIOS if all(side in chosen for side in r.split(" / "))]
    return contender_comparison(args, pair, chosen, ratios)


if __name__ == "__main__":
    sys.exit(main())
