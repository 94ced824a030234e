"""What the side-by-side benchmark scripts (cpu/blas_layout.py, padded_passes.py, cpu/kernel.py,
cpu/packed_weights.py, cpu/layers.py, compiled_draft.py, draft_bits.py, ...) share: a spread of run-by-run figures, the interleaved loop over
prompts and repeats, and writing and printing their summary."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def arguments(doc: str, prompts: str, max_tokens: int, out: str, repeats: int = 3, extra=None,
              **counts: int) -> argparse.Namespace:
    """The options every side-by-side script takes, with its own defaults; `counts`: a
    script's own integer options (name: default); `extra(parser)` adds any others."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--suite", default="code")
    ap.add_argument("--prompts", type=str, default=prompts,
                    help="prompt ids of the suite, comma-separated, or 0 for all")
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--repeats", type=int, default=repeats)
    for name, default in counts.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--out", type=Path, default=Path(out))
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    ready_to_write(args.out)
    return args


def ready_to_write(path: Path) -> None:
    """Make `path`'s folder (as `mlxspec bench --out` does), or exit with one line, before
    any slow work: a run must not end in a traceback over where to write it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"--out {path}: cannot make its folder ({e.strerror or e})")
    if path.is_dir():
        raise SystemExit(f"--out {path}: is a folder; give a file name, e.g. {path / 'results.json'}")


def chosen_prompts(args: argparse.Namespace) -> list[dict]:
    """The prompts of `args.suite` (suites comma-separated) that `args.prompts` names (all for "0")."""
    suite = [p for name in args.suite.split(",")
             for p in json.loads((ROOT / f"benchmarks/suites/{name}.json").read_text())["prompts"]]
    wanted = None if args.prompts == "0" else args.prompts.split(",")
    return [p for p in suite if wanted is None or p["id"] in wanted]


def spread(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3), "n": len(xs)}


def finish(out: dict, path: Path, per_pass: dict | None = None) -> int:
    """Write `out` (with "tok_s", "ratios" and "outputs_identical") to `path`, print it in
    short, and return the exit status: 0 when every output was identical."""
    path.write_text(json.dumps(out, indent=1))
    for k, v in out["tok_s"].items():
        extra = f", {per_pass[k]['median']:.2f} tokens/pass" if per_pass else ""
        print(f"{k:14s} {v['median']:.2f} tok/s ({v['min']:.2f}-{v['max']:.2f}){extra}")
    for k, v in out["ratios"].items():
        print(f"{k:26s} {v['median']:.2f}x ({v['min']:.2f}-{v['max']:.2f}, n={v['n']})")
    identical = out["outputs_identical"]
    print("all outputs identical" if identical else "OUTPUTS DIFFER")
    return 0 if identical else 1


def swap(model, modules: dict, which: bool) -> None:
    """Put module `pair[which]` at each path of `modules` ({path: (module, module)}) in `model`."""
    from mlxspec.cpu.blas_layout import put_module

    for path, pair in modules.items():
        put_module(model, path, pair[which])


def interleave(prompts: list[dict], names: list[str], run, encode, ratios: list[str], repeats: int,
               max_tokens: int) -> dict:
    """Each prompt: one short warm-up run per contender (and its calibration), then `repeats`
    rounds of every contender, in an order rotated per repeat.  `run(name, ids, n)` gives a
    bench_contenders.Run; `ratios` are "a / b" of contender names, taken run by run.  Returns
    tok_s / tokens_per_pass / ratios (spreads), outputs_identical and the raw runs."""
    tps = {c: [] for c in names}
    per_pass = {c: [] for c in names}
    got = {k: [] for k in ratios}
    runs, identical = [], True
    for p in prompts:
        ids = encode(p["prompt"])
        for c in names:
            run(c, ids, 8)
        for r in range(repeats):
            order = names[r % len(names):] + names[: r % len(names)]
            res = {c: run(c, ids, max_tokens) for c in order}
            t = {c: len(res[c].tokens) / res[c].total_time for c in names}  # as bench: decode time incl. prefill
            same = len({tuple(res[c].tokens) for c in names}) == 1
            identical &= same
            for c in names:
                tps[c].append(t[c])
                per_pass[c].append(len(res[c].tokens) / max(1, res[c].target_passes))
            for k in got:
                a, b = k.split(" / ")
                got[k].append(t[a] / t[b])
            runs.append({"prompt": p["id"], "repeat": r, "order": order, "tps": {c: round(v, 3) for c, v in t.items()},
                         "tokens_per_pass": {c: round(per_pass[c][-1], 2) for c in names}, "identical": same})
            print(p["id"], r, " ".join(f"{c} {v:.2f}" for c, v in t.items()),
                  "tok/pass " + "/".join(f"{per_pass[c][-1]:.2f}" for c in names),
                  "identical" if same else "DIFFERENT", flush=True)
    return {"tok_s": {c: spread(v) for c, v in tps.items()}, "tokens_per_pass": {c: spread(v) for c, v in per_pass.items()},
            "ratios": {k: spread(v) for k, v in got.items()}, "outputs_identical": identical, "runs": runs}


def variant_contenders(label: str, tweak) -> dict:
    """Plain, the default (trees) and chains, and trees and chains as "trees <label>" and
    "chains <label>", whose decoders are built by `tweak(build)` (`build()` makes the
    stock decoder; the tweak may set things up around it or change what it returns)."""
    from mlxspec.bench.contenders import MlxspecContender, make_contender

    class Tweaked(MlxspecContender):
        def decoder(self, pair):
            return tweak(lambda: super(Tweaked, self).decoder(pair))

    return {"plain": make_contender("plain"), "trees": make_contender("model:auto"),
            f"trees {label}": Tweaked(f"trees {label}", num_draft="auto"),
            "chains": make_contender("model:auto:chain"),
            f"chains {label}": Tweaked(f"chains {label}", num_draft="auto", tree=False)}


def contender_comparison(args: argparse.Namespace, pair, contenders: dict, ratios: list[str]) -> int:
    """Run `contenders` ({name: bench_contenders.Contender}) interleaved on the chosen prompts,
    greedy; write, print and return as `finish` does."""
    from mlxspec.api import encode_prompt

    def run(name, ids, n):
        return contenders[name].run(pair, ids, temp=0.0, max_tokens=n, seed=0)

    summary = interleave(chosen_prompts(args), list(contenders), run,
                         lambda text: encode_prompt(pair.tokenizer, text, chat_template=True),
                         ratios, args.repeats, args.max_tokens)
    out = {"command": " ".join(sys.argv), "suite": args.suite, "max_tokens": args.max_tokens,
           "repeats": args.repeats, **summary}
    return finish(out, args.out, out["tokens_per_pass"])


def swapped_comparison(args: argparse.Namespace, pair, modules: dict, contenders: dict, ratios: list[str],
                       extra: dict | None = None) -> int:
    """Run `contenders` ({name: (contender spec, which)}) interleaved on the chosen prompts,
    with module `which` of `modules` ({"target"|"draft": {path: (module, module)}}) put in
    the pair's models for each run; write, print and return as `finish` does."""
    from mlxspec import device as backend
    from mlxspec.api import encode_prompt
    from mlxspec.bench.contenders import make_contender

    prompts = chosen_prompts(args)
    made = {name: (make_contender(spec), which) for name, (spec, which) in contenders.items()}

    def run(name, ids, n):
        c, which = made[name]
        swap(pair.target, modules["target"], which)
        swap(pair.draft, modules["draft"], which)
        return c.run(pair, ids, temp=0.0, max_tokens=n, seed=0)

    summary = interleave(prompts, list(made), run,
                         lambda text: encode_prompt(pair.tokenizer, text, chat_template=True),
                         ratios, args.repeats, args.max_tokens)
    out = {"command": " ".join(sys.argv), "backend": backend.describe(), **(extra or {}),
           "suite": args.suite, "max_tokens": args.max_tokens, "prompts": [p["id"] for p in prompts],
           "repeats": args.repeats, **summary}
    return finish(out, args.out, out["tokens_per_pass"])


def report(args: argparse.Namespace, prompts: list[dict], pair, names: list[str], run, ratios: list[str]) -> int:
    """`interleave` the contenders `names` greedily over `prompts` (chat-templated), then
    `finish` with the command, backend and settings; the exit status."""
    from mlxspec import device as backend
    from mlxspec.api import encode_prompt

    summary = interleave(prompts, names, run, lambda text: encode_prompt(pair.tokenizer, text, chat_template=True),
                         ratios, args.repeats, args.max_tokens)
    out = {"command": " ".join(sys.argv), "backend": backend.describe(), "suite": args.suite,
           "max_tokens": args.max_tokens, "prompts": [p["id"] for p in prompts], "repeats": args.repeats, **summary}
    return finish(out, args.out, out["tokens_per_pass"])
