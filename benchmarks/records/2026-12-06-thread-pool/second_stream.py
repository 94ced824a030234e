"""Does MLX work on a second stream slow the kernels for the rest of the process?

    python benchmarks/records/2026-12-06-thread-pool/second_stream.py plain ours stream plain ours

One process, the default pair, js-debounce (64 tokens, greedy).  Phases, run in the order given:

* `plain`: plain decoding, 32 tokens: ms per token after the first;
* `ours`: the default decoder (trees): seconds from its 6th token to its last;
* `mlxlm`: mlx-lm k=3 through mlx-lm's own `stream_generate` (its thread-local generation stream):
  seconds from its 5th token to its last; `mlxlm-default` the same on MLX's default stream;
* `stream`: a prefill and 20 target steps through the model on a new thread-local stream;
* `threads`: the process's thread count.

With OpenMP (before stop 49) a product on another stream's thread started a second team of threads,
and libgomp then cut idle workers' spin for the rest of the process; with thread_pool.c it does not.
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import mlxspec  # noqa: E402
import mlx.core as mx  # noqa: E402
from mlxspec.api import encode_prompt, make_decoder, stream_generate  # noqa: E402

prompt = next(p for p in json.loads((ROOT / "benchmarks/suites/code.json").read_text())["prompts"]
              if p["id"] == "js-debounce")
pair = mlxspec.load()
ids = encode_prompt(pair.tokenizer, prompt["prompt"], chat_template=True)


def decode(drafter, tokens):
    dec = make_decoder(pair, drafter, "auto" if drafter != "none" else 0, 0.0)
    return [time.perf_counter() for c in stream_generate(pair, ids, max_tokens=tokens, decoder=dec, temp=0.0, seed=0)
            if c.token >= 0]


def mlx_lm(on_default: bool):
    from mlx_lm.generate import stream_generate as sg
    from mlx_lm.sample_utils import make_sampler

    kw = dict(sampler=make_sampler(0.0), draft_model=pair.draft, num_draft_tokens=3)
    if on_default:
        kw["stream"] = mx.default_stream(mx.default_device())
    return [time.perf_counter() for r in sg(pair.target, pair.tokenizer, mx.array(ids, dtype=mx.uint32), 64, **kw)
            if r.finish_reason != "stop"]


def other_stream():
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(pair.target)
    with mx.stream(generation_stream):
        out = pair.target(mx.array([ids], dtype=mx.uint32), cache=cache)
        for _ in range(20):
            out = pair.target(mx.argmax(out[:, -1:], -1).astype(mx.uint32), cache=cache)
            mx.eval(out)


for phase in sys.argv[1:]:
    if phase == "plain":
        t = decode("none", 32)
        print(f"plain {(t[-1] - t[0]) / (len(t) - 1) * 1e3:.1f} ms/token", flush=True)
    elif phase == "ours":
        t = decode("model", 64)
        print(f"ours {t[-1] - t[5]:.3f} s", flush=True)
    elif phase in ("mlxlm", "mlxlm-default"):
        t = mlx_lm(phase == "mlxlm-default")
        print(f"{phase} {t[-1] - t[4]:.3f} s", flush=True)
    elif phase == "stream":
        other_stream()
        print("ran the target on another stream", flush=True)
    elif phase == "threads":
        print(f"threads {len(os.listdir('/proc/self/task'))}", flush=True)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
