"""What the long-run-rate bar of the draft-length rule (draft_length.py) gains.

    python benchmarks/long_run_rate.py                      # the code suite, 64 tokens, 3 repeats
    python benchmarks/long_run_rate.py --suite chat --prompts 0 --max-tokens 48

One process, the default pair loaded once.  Contenders run interleaved on each
prompt, warm, in a rotating order per repeat: plain decoding, and the default
(token trees) and chains, each with the bar min(R, E/T) (as shipped) and with the
round's own E/T alone (the rule before it: their policies' long-run rate switched
off).  Reported: decode tok/s per contender (prefill included, as `side_by_side`
counts it), run-by-run ratios, tokens per target pass, and whether every greedy
output is identical (it must be: the rule only decides what is drafted).  Needs the
pair pulled.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, contender_comparison, variant_contenders  # noqa: E402

RATIOS = ["trees / trees round bar", "chains / chains round bar", "trees / plain", "trees round bar / plain",
          "trees / chains"]


def round_bar(build):
    """A decoder whose policy judges each token by its round's own E/T."""
    dec = build()
    dec.policy.rate = lambda: None
    return dec


def main() -> int:
    args = arguments(__doc__, "0", 64, "long-run-rate.json")
    pair = mlxspec.load()
    contenders = variant_contenders("round bar", round_bar)
    return contender_comparison(args, pair, contenders, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
