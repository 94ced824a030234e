"""benchmarks/loop_price.py: every round after the first is paired with its own passes,
timed on separate caches, and the generation's output is the decoder's own."""

from bench_util import load_benchmark
from mlxspec.api import make_decoder
from mlxspec.core.stats import GenerationStats


def test_rounds_are_paired_with_their_passes_and_the_output_is_unchanged(tiny_pair):
    loop_price = load_benchmark("loop_price")
    ids = tiny_pair.tokenizer.encode("the cat sat on the mat and the cat sat on the")
    rows = loop_price.paired_rounds(tiny_pair, make_decoder(tiny_pair), ids, 16)
    stats = GenerationStats()
    stats.rounds = []
    out = [t for t, _ in make_decoder(tiny_pair).generate(list(ids), max_tokens=16, stats=stats)]  # a fresh policy
    assert len(rows) == len(stats.rounds) - 1  # every round but the first (it holds the prompt)
    assert [(r["draft_widths"], r["verify_width"], r["emitted"]) for r in rows] == \
        [(list(w), v, e) for w, v, e in stats.rounds[1:]]  # the pairing did not change the rounds
    assert sum(r["emitted"] for r in rows) == len(out) - stats.rounds[0][2]
    assert all(r["verify_ms"] > 0 and r["plain_ms"] > 0 and r["vs_price"] > 0 for r in rows)
    assert all((r["draft_ms"] > 0) == bool(r["draft_widths"]) for r in rows)
    s = loop_price.summary(rows)
    assert set(s) <= {"speculative", "plain"} and all(v["rounds"] >= 2 for v in s.values())
