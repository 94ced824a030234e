"""What storing a converted GGUF as float16 (format 2) costs against float32 (format 1).

    python benchmarks/storage_dtype.py                       # the default pair
    python benchmarks/storage_dtype.py smollm2-135m          # any catalog names

For each catalog model: its float16 cache entry (converted as mlxspec does) and a
float32 folder written by the same converter with storage switched off (what
mlxspec 0.1 wrote), in a temp folder beside the cache.  Reported:

* disk size of both folders;
* the largest change float16 made to any weight (recorded in config.json) and,
  for scale, the GGUF's own quantisation step (the largest |w| change that
  re-quantising the dequantised float32 values to Q8_0 would make);
* logits of both models over a code prompt: max |difference| / max |logit|, and
  whether greedy decoding of --tokens tokens is identical;
* load time (`loading.load_model_dir`, float32 compute on the CPU), both folders
  interleaved, --repeats times: with the page cache warm (the figure a second run
  sees) and cold (the first run after a reboot: the page cache is dropped before
  each load, which needs root on Linux; skipped otherwise); median and range.

Writes the figures to --out (JSON).  Needs the models pulled (`mlxspec pull`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxspec  # noqa: E402,F401  (sets up the MLX backend first)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlxspec.models.gguf import convert as gguf
from mlxspec.models import loading
from mlxspec.util import tempfiles
from mlxspec.models.pinned import fetch as weights  # noqa: E402

PROMPT = "def binary_search(items, target):\n    \"\"\"Return the index of target in sorted items, or -1.\"\"\"\n"


def float32_folder(name: str, beside: Path) -> Path:
    """A format-1-style folder: the same converter, every tensor kept float32."""
    path = weights.ensure(name, progress=False)
    out = tempfiles.mkdtemp(beside, f"f32-{name}")
    gguf.convert_into(path, out, gguf.sha256_file(path), progress=False, float16=False)
    return out


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def greedy(model, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    first = np.array(logits[0].astype(mx.float32))
    out = []
    for _ in range(n):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)
    return out, first


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed_load(folder: Path, cold: bool = False) -> float:
    if cold:
        drop_page_cache()
    start = time.perf_counter()
    model, _, _ = loading.load_model_dir(folder)
    took = time.perf_counter() - start
    del model
    mx.clear_cache()
    return took


def one(name: str, tokens: int, repeats: int) -> dict:
    f16 = weights.converted(name, progress=False)
    f32 = float32_folder(name, f16.parent)
    try:
        storage = json.loads((f16 / "config.json").read_text())["mlxspec"]["storage"]
        m16, tok, _ = loading.load_model_dir(f16)
        ids = tok.encode(PROMPT)
        out16, l16 = greedy(m16, ids, tokens)
        del m16
        m32, _, _ = loading.load_model_dir(f32)
        out32, l32 = greedy(m32, ids, tokens)
        del m32
        mx.clear_cache()
        timed_load(f16), timed_load(f32)  # warm the page cache
        modes = ["warm", "cold"] if drop_page_cache() else ["warm"]
        times = {f"{kind} {mode}": [] for mode in modes for kind in ("float16", "float32")}
        for mode in modes:
            for r in range(repeats):
                for kind in (["float16", "float32"] if r % 2 == 0 else ["float32", "float16"]):
                    times[f"{kind} {mode}"].append(timed_load(f16 if kind == "float16" else f32, mode == "cold"))
        same = sum(a == b for a, b in zip(out16, out32))
        row = {
            "model": name, "disk_float16_gb": size(f16) / 1e9, "disk_float32_gb": size(f32) / 1e9,
            "storage": storage,
            "logits_max_abs_diff": float(np.abs(l16 - l32).max()),
            "logits_max_abs": float(np.abs(l32).max()),
            "greedy_tokens": tokens, "greedy_identical": out16 == out32,
            "greedy_first_difference": None if out16 == out32 else same,
            "load_s": {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
                       for k, v in times.items()},
        }
    finally:
        shutil.rmtree(f32, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=list(weights.DEFAULT_PAIR))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("storage_dtype.json"))
    args = ap.parse_args()
    rows = []
    for name in args.names:
        row = one(name, args.tokens, args.repeats)
        rows.append(row)
        s, ld = row["storage"], row["load_s"]
        print(f"{name}: disk {row['disk_float32_gb']:.2f} -> {row['disk_float16_gb']:.2f} GB; "
              f"max weight change {s['max_abs_change']:.2e} abs, {s['max_rel_change']:.2e} rel "
              f"({s['float32_matrices']} matrices kept float32); logits max diff "
              f"{row['logits_max_abs_diff']:.3g} of {row['logits_max_abs']:.3g}; greedy {args.tokens} tokens "
              f"{'identical' if row['greedy_identical'] else 'differ at ' + str(row['greedy_first_difference'])}; "
              "load " + ", ".join(f"{k} {v['median']:.2f} s ({v['min']:.2f}-{v['max']:.2f})" for k, v in ld.items()),
              flush=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "models": rows}, indent=1))


if __name__ == "__main__":
    main()
