"""Stop 44's two changes to the per-row work of a tree round, each against what it replaced,
one process, interleaved, warm, in a rotating order per repeat:

* `--what top-columns` (greedy): a tree level's top candidates by argmax passes
  (tree_drafter.top_columns) against NumPy's argpartition;
* `--what probabilities` (`--temp 0.7`): sampled rows exponentiated by the kernel
  (kernel_ops.probabilities) against MLX's exp.

    python benchmarks/records/2026-12-05-row-work/ab.py --what top-columns --prompts 0 --out F.json
    python benchmarks/records/2026-12-05-row-work/ab.py --what probabilities --temp 0.7 --suite chat --out F.json
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT)), sys.path.insert(0, str(ROOT / "benchmarks"))
from side_by_side import arguments, chosen_prompts, finish, interleave  # noqa: E402

import mlxspec  # noqa: E402
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlxspec import kernel_ops, tree_drafter  # noqa: E402
from mlxspec.api import encode_prompt  # noqa: E402
from mlxspec.bench_contenders import MlxspecContender, make_contender  # noqa: E402


def argpartition(rows, k):
    """Before: introselect, the candidates in no order (the caller ranked them)."""
    return np.argpartition(rows, -k, axis=-1)[:, -k:] if rows.shape[-1] > k else \
        np.broadcast_to(np.arange(rows.shape[-1])[None], rows.shape)


OLD = {"top-columns": (tree_drafter, "top_columns", argpartition),
       "probabilities": (kernel_ops, "probabilities", mx.exp)}


class Old(MlxspecContender):
    def __init__(self, what):
        super().__init__("trees before", num_draft="auto")
        self.module, self.name_, self.old = OLD[what]

    def run(self, *a, **kw):
        new = getattr(self.module, self.name_)
        setattr(self.module, self.name_, self.old)
        try:
            return super().run(*a, **kw)
        finally:
            setattr(self.module, self.name_, new)


args = arguments(__doc__, "0", 64, "row-work.json", extra=lambda ap: (
    ap.add_argument("--what", choices=list(OLD), required=True), ap.add_argument("--temp", type=float, default=0.0)))
pair = mlxspec.load()
contenders = {"trees": make_contender("model:auto"), "trees before": Old(args.what)}
calls = [0]


def runner(name, ids, n):  # each contender runs once per repeat (and warm-up): both draw with the same seed
    calls[0] += 1
    return contenders[name].run(pair, ids, temp=args.temp, max_tokens=n, seed=(calls[0] - 1) // 2)


summary = interleave(chosen_prompts(args), ["trees", "trees before"], runner,
                     lambda text: encode_prompt(pair.tokenizer, text, chat_template=True),
                     ["trees / trees before"], args.repeats, args.max_tokens)
out = {"command": " ".join(sys.argv), "suite": args.suite, "what": args.what, "temp": args.temp,
       "max_tokens": args.max_tokens, "repeats": args.repeats, **summary}
finish(out, args.out, out["tokens_per_pass"])
sys.exit(0)  # sampled outputs may differ by a float32 rounding of p or q: not a failure here
