"""Two revisions of mlxspec side by side, whole generations: for changes that act
process-wide (the kernel's sources, import-time setup), which one process cannot
switch between runs.

    python benchmarks/revision_ab.py                      # HEAD against the working tree
    python benchmarks/revision_ab.py --base 3329df0 --prompts binary-search,rust-parse --repeats 5

The base revision is exported (`git archive`) into a temporary folder.  Each
repeat runs one child process per revision, in an order alternated per repeat, so
that drift on a shared machine falls on both; a child loads the default pair, warms
every contender up on each prompt (and calibrates once per revision, as any first
use does), then generates greedily with each contender on each prompt, decode
rates timed as `mlxspec bench` times them.  Reported: each contender's decode rate
per revision, the working tree over the base run by run (the two children of a
repeat paired), and, per revision, the default over the other contenders within
its own runs.  Outputs must be identical across contenders and revisions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import ROOT, chosen_prompts, ready_to_write, spread  # noqa: E402  (imports no mlxspec)

CHILD = "--child"


def child(argv: list[str]) -> int:
    """In the revision's tree (cwd): generate and print one JSON line of runs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite"), ap.add_argument("--prompts"), ap.add_argument("--contenders")
    ap.add_argument("--max-tokens", type=int)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    import mlxspec
    from mlxspec.api import encode_prompt
    from mlxspec.bench.contenders import make_contender, timing_figures

    prompts = chosen_prompts(args)
    pair = mlxspec.load()
    made = {spec: make_contender(spec) for spec in args.contenders.split(",")}
    runs = []
    for p in prompts:
        ids = encode_prompt(pair.tokenizer, p["prompt"], chat_template=True)
        for c in made.values():
            c.run(pair, ids, temp=0.0, max_tokens=8, seed=0)  # warm-up (and calibration)
        for spec, c in made.items():
            r = c.run(pair, ids, temp=0.0, max_tokens=args.max_tokens, seed=0)
            fig = timing_figures(r.token_times, r.from_draft, r.total_time)
            runs.append({"prompt": p["id"], "contender": spec, "decode_tps": round(fig["decode_tps"], 3),
                         "tokens": r.tokens, "passes": r.target_passes})
    print(json.dumps({"source": str(Path(mlxspec.__file__).parent), "runs": runs}))
    return 0


def last_line(err: bytes | str) -> str:
    text = err.decode(errors="replace") if isinstance(err, bytes) else err
    return (text.strip().splitlines() or ["(no message)"])[-1]


def ratio_text(xs: list[float]) -> str:
    s = spread(xs)
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}, n={s['n']})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision to compare the working tree with")
    ap.add_argument("--suite", default="code")
    ap.add_argument("--prompts", default="binary-search,sql-query,rust-parse",
                    help="prompt ids of the suite, comma-separated, or 0 for all")
    ap.add_argument("--contenders", default="plain,model:auto,mlx-lm:3", help="as mlxspec bench --contenders")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("revision-ab.json"))
    args = ap.parse_args()
    ready_to_write(args.out)
    specs = args.contenders.split(",")
    default = "model:auto" if "model:auto" in specs else specs[-1]
    with tempfile.TemporaryDirectory(prefix="mlxspec-ab-") as tmp:
        archive = subprocess.run(["git", "archive", args.base], cwd=ROOT, capture_output=True)
        if archive.returncode:
            raise SystemExit(f"revision_ab: cannot export {args.base!r}: {last_line(archive.stderr)}")
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        trees = {args.base: Path(tmp), "working tree": ROOT}
        got: dict = {name: [] for name in trees}
        for rep in range(args.repeats):
            order = list(trees) if rep % 2 == 0 else list(trees)[::-1]
            for name in order:
                done = subprocess.run([sys.executable, str(Path(__file__).resolve()), CHILD, "--suite", args.suite,
                                       "--prompts", args.prompts, "--contenders", args.contenders,
                                       "--max-tokens", str(args.max_tokens)],
                                      cwd=trees[name], capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"revision_ab: the run of {name} failed: {last_line(done.stderr)}")
                line = json.loads(done.stdout.strip().splitlines()[-1])
                runs = line["runs"]
                if rep == 0:
                    print(f"{name}: mlxspec from {line['source']}")
                got[name].append(runs)
                print(f"repeat {rep + 1}/{args.repeats}, {name}: " + "  ".join(
                    f"{r['prompt']} {r['contender']} {r['decode_tps']:.2f}" for r in runs), flush=True)
    base, tree = got[args.base], got["working tree"]
    outputs: dict = {}
    for runs in base + tree:
        for r in runs:
            outputs.setdefault(r["prompt"], set()).add(tuple(r["tokens"]))
    identical = all(len(v) == 1 for v in outputs.values())
    summary: dict = {"command": " ".join(sys.argv), "base": args.base, "suite": args.suite, "prompts": args.prompts,
                     "max_tokens": args.max_tokens, "repeats": args.repeats, "outputs_identical": identical,
                     "tok_s": {}, "tree_over_base": {}, "within": {}, "runs": got}
    for spec in specs:
        for name, reps in got.items():
            xs = [r["decode_tps"] for runs in reps for r in runs if r["contender"] == spec]
            summary["tok_s"][f"{spec} @ {name}"] = xs
            print(f"{spec:12s} {name:12s} {statistics.median(xs):.2f} tok/s ({min(xs):.2f}-{max(xs):.2f})")
        ratios = [t["decode_tps"] / b["decode_tps"] for tr, br in zip(tree, base) for t, b in zip(tr, br)
                  if t["contender"] == spec]
        summary["tree_over_base"][spec] = ratios
        print(f"{spec:12s} working tree over {args.base}: {ratio_text(ratios)}")
    for name, reps in got.items():
        for spec in specs:
            if spec == default:
                continue
            xs = [d["decode_tps"] / o["decode_tps"] for runs in reps for d in runs for o in runs
                  if d["prompt"] == o["prompt"] and d["contender"] == default and o["contender"] == spec]
            summary["within"][f"{default} / {spec} @ {name}"] = xs
            print(f"{name:12s} {default} over {spec}: {ratio_text(xs)}")
    print("all outputs identical" if identical else "OUTPUTS DIFFER")
    args.out.write_text(json.dumps(summary, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(child(sys.argv[2:]) if sys.argv[1:2] == [CHILD] else main())
