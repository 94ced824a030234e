"""What compiling the draft's forwards (mlxspec/cpu/compiled_forward.py) gains.

    python benchmarks/compiled_draft.py                     # the code suite, 64 tokens, 3 repeats
    python benchmarks/compiled_draft.py --suite chat --prompts 0 --max-tokens 48

One process, the default pair loaded once.  Contenders run interleaved on each
prompt, warm, in a rotating order per repeat: plain decoding, and the default
(token trees) and chains, each with the draft's forwards compiled (as shipped)
and uncompiled (their decoders built with MLXSPEC_COMPILED_DRAFT=0, so each has
its own calibration: an uncompiled draft step costs more).  Reported: decode
tok/s per contender (prefill included, as `side_by_side` counts it), run-by-run
ratios, tokens per target pass, and whether every greedy output is identical
(it must be: the draft only proposes).  Needs the pair pulled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec.cpu import compiled_forward  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import arguments, contender_comparison, variant_contenders  # noqa: E402

RATIOS = ["trees / trees uncompiled", "chains / chains uncompiled", "trees / plain", "trees uncompiled / plain",
          "trees / chains"]


def uncompiled(build):
    """A decoder built with MLXSPEC_COMPILED_DRAFT=0 (the draft's forwards uncompiled)."""
    old = os.environ.get(compiled_forward.ENV)
    os.environ[compiled_forward.ENV] = "0"
    try:
        return build()
    finally:
        if old is None:
            del os.environ[compiled_forward.ENV]
        else:
            os.environ[compiled_forward.ENV] = old


def main() -> int:
    args = arguments(__doc__, "0", 64, "compiled-draft.json")
    pair = mlxspec.load()
    contenders = variant_contenders("uncompiled", uncompiled)
    why = compiled_forward.unusable(contenders["trees"].decoder(pair).drafter.state)
    if why is not None:
        print(f"the draft's forwards cannot be compiled here: {why}", file=sys.stderr)
        return 2
    return contender_comparison(args, pair, contenders, RATIOS)


if __name__ == "__main__":
    sys.exit(main())
