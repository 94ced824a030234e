"""What the fallback's probes cost: the default against the default that never probes once it falls back.

    python benchmarks/records/2026-12-06-stop53/probes_ab.py --suite creative --max-tokens 48

One process, the default pair loaded once; plain decoding, the default, and the default with
draft_length.PROBE_EVERY and PROBE_MAX set out of reach while it runs (a fallback then lasts the
generation), interleaved on each prompt, warm, in a rotating order per repeat.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import mlxspec  # noqa: E402  (sets up the MLX backend first)
from mlxspec import draft_length  # noqa: E402
from mlxspec.bench_contenders import make_contender  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from side_by_side import arguments, chosen_prompts, report  # noqa: E402

NEVER = 10 ** 9


def main() -> int:
    args = arguments(__doc__, "0", 48, "probes-ab.json")
    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    contenders = {"plain": make_contender("plain"), "default": make_contender("model:auto"),
                  "no probes": make_contender("model:auto")}
    shipped = draft_length.PROBE_EVERY, draft_length.PROBE_MAX

    def run(name, ids, n):
        if name == "no probes":
            draft_length.PROBE_EVERY = draft_length.PROBE_MAX = NEVER
        try:
            return contenders[name].run(pair, ids, temp=0.0, max_tokens=n, seed=0)
        finally:
            draft_length.PROBE_EVERY, draft_length.PROBE_MAX = shipped

    return report(args, prompts, pair, list(contenders), run,
                  ["default / plain", "no probes / plain", "default / no probes"])


if __name__ == "__main__":
    sys.exit(main())
