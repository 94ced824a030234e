"""Benchmark reports: the machine and versions, the terminal table, summary.md, chart.png
(matplotlib, the optional `bench` extra) and results.json."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from .runner import _fmt_time


def machine_info() -> dict:
    import mlx.core as mx

    from ..device import describe

    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "backend": describe(),
        "device": str(mx.default_device()),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_bytes": mem,
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "load_average": load,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("mlx", "mlx-lm", "mlxspec", "numpy", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _match(m):
    return "-" if not m else f"{m['matched']}/{m['checked']}"


TABLE_COLUMNS = ("suite", "contender", "tok/s", "speed-up", "e2e", "accept", "tok/pass", "tree n/d", "peak MB",
                 "= plain")


def _tree(r) -> str:
    """Mean tree size / depth per round ('-': chains)."""
    if r.get("tree_nodes_per_round") is None:
        return "-"
    return f"{r['tree_nodes_per_round']:.1f}/{r['tree_depth_per_round']:.1f}"


def table_rows(summary: list[dict], temp: float) -> list[list[str]]:
    rows = []
    for r in summary:
        if r["temp"] != temp:
            continue
        rows.append([
            r["suite"], r["contender"], _num(r["tokens_per_s"]),
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
            "-" if r.get("e2e_speedup") is None else f"{r['e2e_speedup']:.2f}x", _pct(r["acceptance_rate"]),
            _num(r["mean_accepted_length"]), _tree(r), f"{r['peak_memory_bytes'] / 2**20:.0f}",
            _match(r["greedy_match"]),
        ])
    return rows


def format_table(summary: list[dict]) -> str:
    out = []
    for temp in sorted({r["temp"] for r in summary}):
        rows = table_rows(summary, temp)
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(TABLE_COLUMNS)]
        out.append(f"temperature {temp:g}" + ("  (greedy: '= plain' counts outputs identical to plain decoding)"
                                              if temp == 0 else ""))
        line = "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(TABLE_COLUMNS, widths)))
        out += [line, "-" * len(line)]
        prev = None
        for row in rows:
            if prev is not None and row[0] != prev:
                out.append("")
            prev = row[0]
            out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        out.append("")
    return "\n".join(out)


def markdown(doc: dict) -> str:
    m, cfg = doc["machine"], doc["config"]
    lines = [
        "# mlxspec bench",
        "",
        f"- command: `{doc['command']}`",
        f"- date: {doc['date']}",
        f"- pair: {doc['pair']['describe']}",
        f"- backend: {m['backend']}; {m['platform']}; {m['cpu_count']} CPUs; load average at start "
        f"{', '.join(f'{x:.2f}' for x in (doc.get('load_average_start') or []))}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v),
        f"- prompts: {len(doc['prompts'])} ({', '.join(cfg['suites'])}; {cfg['prompts_per_suite'] or 'all'} per suite), "
        f"max {cfg['max_tokens']} tokens, temperatures {', '.join(f'{t:g}' for t in cfg['temps'])}, "
        f"{cfg['repeats']} repeat(s), seed {cfg['seed']}; run time {_fmt_time(doc['elapsed_s'])}"
        + (" (INTERRUPTED: partial results)" if doc.get("interrupted") else ""),
        "",
        "tok/s: decode rate after the first round (median over prompts); speed-up: per-prompt ratio to plain, "
        "median over prompts; e2e: the same with prompt processing included; accept: drafted tokens kept; tok/pass: tokens per target forward pass; "
        "= plain: greedy outputs identical to plain decoding (token ids).",
        "",
    ]
    for temp in sorted({r["temp"] for r in doc["summary"]}):
        lines += [f"## Temperature {temp:g}", "", "| " + " | ".join(TABLE_COLUMNS) + " |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (len(TABLE_COLUMNS) - 2)) + "|"]
        for row in table_rows(doc["summary"], temp):
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    per = {}
    for row in doc["summary"]:
        if row.get("temp") == 0 and row.get("suite") != "all" and row.get("near_ties"):
            per[row["contender"]] = per.get(row["contender"], 0) + row["near_ties"]
    ties = [f"{c} {n}" for c, n in per.items()]
    if ties:
        lines += ["Near-ties (greedy tokens whose two best logits were within the dtype's rounding; only there "
                  "can output differ from one-position decoding): " + ", ".join(ties) + ".", ""]
    mism = [r for r in doc["runs"] if r.get("matches_plain") is False]
    if mism:
        lines += ["## Greedy outputs that differ from plain decoding", ""]
        for r in mism:
            gap = r.get("near_tie_gap")
            why = "" if gap is None else (f"; target logit gap {gap:.3g}: "
                                          + ("a near-tie (float rounding)" if r.get("near_tie") else "NOT a near-tie"))
            if r.get("counted_near_tie") is not None:
                why += "; counted as a near-tie by the run" if r["counted_near_tie"] else "; NOT counted as a near-tie"
            lines.append(f"- {r['contender']} on {r['prompt']} (repeat {r['repeat']}): first difference at token "
                         f"{r['first_divergence']}{why}")
        lines.append("")
    if doc["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s['contender']}: {s['reason']}" for s in doc["skipped"]] + [""]
    if doc.get("chart"):
        lines += [f"![speed-up and acceptance]({Path(doc['chart']).name})", ""]
    return "\n".join(lines)


def chart(doc: dict, path: Path) -> str | None:
    """speed-up and acceptance per suite and contender; None (and a reason) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    summary = doc["summary"]
    temps = sorted({r["temp"] for r in summary})
    suites = list(dict.fromkeys(r["suite"] for r in summary))
    names = [c["name"] for c in doc["contenders"] if c["name"] != "plain"]
    if not names:
        return None
    fig, axes = plt.subplots(len(temps), 2, figsize=(13, 4.2 * len(temps)), squeeze=False)
    width = 0.8 / len(names)
    for ti, temp in enumerate(temps):
        by = {(r["suite"], r["contender"]): r for r in summary if r["temp"] == temp}
        for ai, (metric, label) in enumerate((("speedup", "speed-up vs plain (x)"),
                                              ("acceptance_rate", "acceptance rate"))):
            ax = axes[ti][ai]
            for ci, name in enumerate(names):
                vals = [(by.get((s, name)) or {}).get(metric) or 0.0 for s in suites]
                xs = [i + (ci - (len(names) - 1) / 2) * width for i in range(len(suites))]
                bars = ax.bar(xs, vals, width, label=name)
                for b, v in zip(bars, vals):
                    if v:
                        ax.annotate(f"{v:.2f}" if metric == "speedup" else f"{100 * v:.0f}%",
                                    (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
            if metric == "speedup":
                ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            else:
                ax.set_ylim(0, 1.05)
            ax.set_xticks(range(len(suites)))
            ax.set_xticklabels(suites)
            ax.set_ylabel(label)
            ax.set_title(f"{label}, T={temp:g}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(names), 4), fontsize=8, frameon=False)
    fig.suptitle(f"mlxspec bench: {doc['pair']['describe']}\n{doc['machine']['backend']}", fontsize=10)
    rows = (len(names) + 3) // 4
    fig.tight_layout(rect=(0, 0.03 + 0.035 * rows / len(temps), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_outputs(doc: dict, out: Path, echo=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": str(out / "results.json"), "markdown": str(out / "summary.md")}
    png = chart(doc, out / "chart.png")
    if png:
        paths["png"] = png
        doc["chart"] = png
    else:
        echo("no chart: matplotlib is not installed (pip install 'mlxspec[bench]')")
    doc["outputs"] = paths
    Path(paths["json"]).write_text(json.dumps(doc, indent=1))
    Path(paths["markdown"]).write_text(markdown(doc))
    return paths
