"""Cost profiles: what a draft step and a verify pass cost on a machine we cannot run on
(Apple silicon), so that decisions (`--cost-profile`) and projections (`mlxspec bench
--profile`) can be made with its costs on this one.  docs/profiles.md documents the
format and the sources of the shipped profiles.

A profile is a small JSON object (format FORMAT); every cost is relative to ONE
decode step of the target (batch 1, one position: what mlx-lm's tok/s measures):

    {"format": "mlxspec-cost-profile/1",
     "name": "apple-m3plus-7b",
     "description": "...",
     "draft_step": 0.16,                        # one draft decode step
     "verify": {"2": 1.09, "4": 1.25, "8": 1.8},  # a target pass over w positions (w = 1 is 1.0)
     "draft_widths": {"2": 1.02, "8": 1.15},   # optional: a draft forward over w positions / over 1
     "host_overhead": 0.04,                     # optional: host work per forward (Python, sync), in target steps
     "host_per_position": 0.01,                 # optional: host work per position beyond a forward's first
     "sources": ["..."]}                        #   (a tree node's growing, masking, walking), in target steps

Widths not given are interpolated linearly (beyond the widest, the cost model's own
extrapolation).  Mapped onto `CostModel` (costs/cost_model.py), whose unit is a plain
step of mlxspec's loop, one decode step plus the host overhead h; n is the host's
`host_per_position`:

    verify[w]       = (V(w) + h + n (w - 1)) / (1 + h)
    draft_step      = (d + h) / (1 + h)
    draft_widths[w] = (d * D(w) + h + n (w - 1)) / (d + h)   (a draft forward over w costs that x draft_step)

The shipped profiles' h and n come from the loop's host time measured here
(benchmarks/host_overhead.py: HOST_MS below) over each profile's target step in ms.

`this-machine` names no file: it is the calibration (costs/calibration.py).
Values are range-checked as calibration files are (an inf silently turns drafting off);
a bad file is refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from .cost_model import CostModel, _fill
from ..errors import MlxspecError
from ..util.untrusted import printable, read_json

FORMAT = "mlxspec-cost-profile/1"
THIS_MACHINE = "this-machine"
MAX_FILE_BYTES = 64 << 10
MAX_WIDTH = 64  # widths a profile may price
MAX_RELATIVE = 1000.0  # as costs/calibration.py: a pass or a step costs at most this many target steps
MAX_OVERHEAD = 10.0
KEYS = {"format", "name", "description", "draft_step", "verify", "draft_widths", "host_overhead", "host_per_position",
        "target_step_ms", "sources", "notes"}
# The loop's host time (benchmarks/host_overhead.py, real rounds on a tiny model whose forwards cost next to nothing,
# on this repository's 2-core x86 machine while other work ran: an upper estimate for an Apple core): a forward
# ~0.4 ms, a position beyond a forward's first (a tree node) ~0.1 ms.  A profile's share: these over its target step.
HOST_MS = {"forward": 0.4, "position": 0.1}


def host_share(target_step_ms: float) -> dict:
    """`host_overhead` and `host_per_position` of a Mac whose target step takes `target_step_ms`."""
    return {"host_overhead": round(HOST_MS["forward"] / target_step_ms, 4),
            "host_per_position": round(HOST_MS["position"] / target_step_ms, 4)}


_M3_SOURCES = [
    "/work/shared/notes/apple-silicon.md (docs/profiles.md cites each row's origin)",
    "verify: planning ranges for M3 and later with a 7B 4-bit target (w2 1.03-1.15, w4 1.10-1.40, w8 1.4-2.2, "
    "w16 1.8-2.6, w32 2.5-4.0) from lablup/mlxcel #1204 (M5 Max 12B: 1.03 / 1.13 / 1.73), ml-explore/mlx PR #3791 "
    "(M5 Max 70B: w8 2.20, w16 3.9), ARahim3/mlx-dspark (M4 Pro 4B: w4 1.11), ml-explore/mlx #3839 / #3852",
    "draft step: a 0.5B draft is bound by per-forward overhead (~1.4-2.6 ms a token; mlxcel M5 Max "
    "Qwen2.5-0.5B 637 / 403 tok/s 4-bit / bf16), ~0.10-0.22 of a 7B 4-bit step (0.19 measured on M5 Max)",
]

SHIPPED: dict[str, dict] = {
    "apple-m3plus-7b": {
        "format": FORMAT, "name": "apple-m3plus-7b",
        "description": "0.5B draft, 7B 4-bit target, Apple M3 or later (fast small-batch quantized kernel)",
        "draft_step": 0.16,
        "verify": {"1": 1.0, "2": 1.09, "4": 1.25, "8": 1.8, "16": 2.2, "32": 3.25},
        "draft_widths": {"1": 1.0, "2": 1.02, "4": 1.05, "8": 1.15, "16": 1.4},
        "target_step_ms": 10.0, **host_share(10.0),
        "sources": _M3_SOURCES,
        "notes": "midpoints of the published ranges; draft widths are inferences; host time measured here (HOST_MS)",
    },
    "apple-m3plus-32b": {
        "format": FORMAT, "name": "apple-m3plus-32b",
        "description": "0.5B draft, 32B 4-bit target, Apple M3 or later",
        "draft_step": 0.06,
        "verify": {"1": 1.0, "2": 1.09, "4": 1.25, "8": 2.0, "16": 3.0, "32": 4.0},
        "draft_widths": {"1": 1.0, "2": 1.02, "4": 1.05, "8": 1.15, "16": 1.4},
        "target_step_ms": 41.0, **host_share(41.0),
        "sources": _M3_SOURCES + [
            "32B step: itsmostafa/inference-speed-tests (M4 Max Qwen2.5-32B 4-bit 24.5 tok/s, ~41 ms) against a "
            "0.5B step of 1.6-2.6 ms: 0.04-0.06, plus a margin for an older chip's draft",
            "wide passes of big targets climb faster (M5 Max 70B: w8 2.20, w16 3.9): w8 and above from those",
        ],
        "notes": "w2 and w4 the 7B midpoints; w8 upward between the 7B ranges and the 70B measurement",
    },
    "apple-m3plus-1.5b": {
        "format": FORMAT, "name": "apple-m3plus-1.5b",
        "description": "0.5B draft, 1.5B 4-bit target, Apple M3 or later",
        "draft_step": 0.6,
        "verify": {"1": 1.0, "2": 1.05, "4": 1.15, "8": 1.38, "16": 1.65, "32": 2.3},
        "draft_widths": {"1": 1.0, "2": 1.02, "4": 1.05, "8": 1.15, "16": 1.4},
        "target_step_ms": 3.5, **host_share(3.5),
        "sources": [
            "/work/shared/notes/apple-silicon.md",
            "verify: planning ranges for a 1.5B target, flatter (w4 1.05-1.25, w8 1.15-1.6, w16 1.3-2.0); "
            "w2 and w32 inferred",
            "draft step: 0.5B ~0.45-0.75 of a 1.5B 4-bit step (Rapid-MLX M4 Max Qwen2.5-1.5B 282-308 tok/s; "
            "mlxcel M5 Max Qwen2.5-0.5B 637 tok/s)",
        ],
        "notes": "midpoints; w2, w32 and draft widths are inferences; host time measured here (HOST_MS)",
    },
    "apple-m1-7b": {
        "format": FORMAT, "name": "apple-m1-7b",
        "description": "0.5B draft, 7B 4-bit target, Apple M1 / M2 (no small-batch quantized kernel: steep widths)",
        "draft_step": 0.16,
        "verify": {"1": 1.0, "2": 1.65, "4": 2.85, "8": 5.0, "16": 5.0, "32": 5.0},
        "draft_widths": {"1": 1.0, "2": 1.3, "4": 1.9, "8": 3.0, "16": 3.0},
        "target_step_ms": 26.0, **host_share(26.0),
        "sources": [
            "/work/shared/notes/apple-silicon.md",
            "verify: M1/M2 ranges w2 1.5-1.8, w4 2.5-3.2, w8 and up 4-6 (mlxcel qwen38-mtp-m1ultra: M1 Ultra 27B "
            "1.74 / 3.11 / 5.6; mlx PR #3764: qmv_wide only on M3 and later)",
            "7B step: itsmostafa/inference-speed-tests (M1 Pro Qwen2.5-7B 4-bit 39.0 tok/s, ~26 ms)",
        ],
        "notes": "midpoints; w8 and wider one figure (5.0, the middle of 4-6); draft widths an inference; host time "
                 "measured here (HOST_MS)",
    },
}


class Profile:
    """A checked cost profile: its numbers as given (relative to one target decode step)."""

    def __init__(self, name: str, draft_step: float, verify: dict, draft_widths: dict, host_overhead: float,
                 description: str = "", sources=(), origin: str = "shipped", host_per_position: float = 0.0,
                 target_step_ms: float | None = None):
        self.name, self.description, self.sources, self.origin = name, description, list(sources), origin
        self.draft_step, self.verify, self.draft_widths = draft_step, verify, draft_widths
        self.host_overhead, self.host_per_position, self.target_step_ms = host_overhead, host_per_position, target_step_ms

    def cost_model(self, drafter=None) -> CostModel:
        """The profile as the rules use it (in plain steps of mlxspec's loop, see the module
        docstring).  `drafter`: a drafter without a draft model of its own (prompt lookup,
        layer-skip) keeps its own estimate of its step (`relative_cost`)."""
        h, n = self.host_overhead, self.host_per_position
        width = max(self.verify)
        verify = [round((v + h + n * i) / (1 + h), 4) for i, v in enumerate(_fill(self.verify, width))]
        verify[0] = 1.0
        d = self.draft_step
        if drafter is not None and (not getattr(drafter, "uses_draft_model", False)
                                    or type(drafter).__name__ == "LayerSkipDrafter"):
            d = float(getattr(drafter, "relative_cost", d))
        dw = []
        if self.draft_widths:
            dw = [round((d * x + h + n * i) / (d + h), 4) if d + h > 0 else 1.0
                  for i, x in enumerate(_fill(self.draft_widths, max(self.draft_widths)))]
            dw[0] = 1.0
        return CostModel(round((d + h) / (1 + h), 4), verify, 0.0, f"profile {self.name}", dw)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "name": self.name, "description": self.description,
                "draft_step": self.draft_step, "verify": {str(w): v for w, v in sorted(self.verify.items())},
                "draft_widths": {str(w): v for w, v in sorted(self.draft_widths.items())},
                "host_overhead": self.host_overhead, "host_per_position": self.host_per_position,
                **({"target_step_ms": self.target_step_ms} if self.target_step_ms else {}), "sources": self.sources}


def _number(value, what: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok:
        raise ValueError(f"{what} is {printable(repr(value), 40)}, expected a number in "
                         f"{'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return float(value)


def _widths(d: dict, key: str, required: bool) -> dict[int, float]:
    v = d.get(key)
    if v is None and not required:
        return {}
    if not isinstance(v, dict) or not v or len(v) > MAX_WIDTH:
        raise ValueError(f"{key} must be an object of 1 to {MAX_WIDTH} entries {{\"width\": cost}}")
    out = {}
    for w, c in v.items():
        if not (isinstance(w, str) and w.isdigit() and 1 <= int(w) <= MAX_WIDTH):
            raise ValueError(f"{key} has the width {printable(repr(w), 20)}, expected 1 to {MAX_WIDTH}")
        out[int(w)] = _number(c, f"{key}[{w}]", 0, MAX_RELATIVE, lo_open=True)
    if out.setdefault(1, 1.0) != 1.0:
        raise ValueError(f"{key}[1] is {out[1]!r}: width 1 is the unit, 1.0")
    if required and len(out) < 2:
        raise ValueError(f"{key} needs a width above 1")
    return out


def from_dict(d, origin: str = "file") -> Profile:
    """A Profile from a parsed JSON object (ValueError saying what is wrong)."""
    if not isinstance(d, dict):
        raise ValueError(f"a JSON {type(d).__name__}, not a cost profile")
    if d.get("format") != FORMAT:
        raise ValueError(f"format is {printable(repr(d.get('format')), 40)}, expected {FORMAT!r}")
    unknown = sorted(set(d) - KEYS)
    if unknown:
        raise ValueError(f"unknown key {printable(repr(unknown[0]), 40)} (known: {', '.join(sorted(KEYS))})")
    name = d.get("name", "")
    if not isinstance(name, str) or len(name) > 100:
        raise ValueError("name must be a string of at most 100 characters")
    sources = d.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ValueError("sources must be a list of strings")
    return Profile(name, _number(d.get("draft_step"), "draft_step", 0, MAX_RELATIVE), _widths(d, "verify", True),
                   _widths(d, "draft_widths", False),
                   _number(d.get("host_overhead", 0.0), "host_overhead", 0, MAX_OVERHEAD),
                   str(d.get("description", "")), sources, origin,
                   _number(d.get("host_per_position", 0.0), "host_per_position", 0, MAX_OVERHEAD),
                   None if d.get("target_step_ms") is None else _number(d["target_step_ms"], "target_step_ms", 0,
                                                                         1e6, lo_open=True))


def names() -> list[str]:
    return sorted(SHIPPED) + [THIS_MACHINE]


def load_profile(spec) -> Profile | None:
    """A shipped profile's name, `this-machine` (None: the calibration), a profile file's
    path, or a Profile (returned as it is).  A one-line MlxspecError otherwise."""
    if spec is None or isinstance(spec, Profile):
        return spec
    if not isinstance(spec, (str, Path)):
        raise MlxspecError(f"cost_profile must be a profile name or file, not {type(spec).__name__}")
    s = str(spec)
    if s == THIS_MACHINE:
        return None
    if s in SHIPPED:
        return from_dict(SHIPPED[s], "shipped")
    path = Path(s).expanduser()
    if not path.exists():
        raise MlxspecError(f"unknown cost profile {printable(s, 80)!r}: one of {', '.join(names())}, "
                           "or a profile file (JSON, docs/profiles.md)")
    try:
        return from_dict(read_json(path, f"the cost profile {s}", MAX_FILE_BYTES), "file")
    except (ValueError, TypeError) as e:
        raise MlxspecError(f"bad cost profile {printable(s, 80)}: {str(e).splitlines()[0]}") from None


def profile_cost(spec, drafter=None) -> CostModel | None:
    """The CostModel the rules decide by under `spec` (None for this-machine or None)."""
    p = load_profile(spec)
    return None if p is None else p.cost_model(drafter)


# ---------------------------------------------------------------------------
# Pricing recorded work (GenerationStats.rounds): what it would cost under a cost model.


def round_parts(r) -> tuple:
    """(draft_widths, verify_width, emitted) of a round record: a `stats.rounds` dict or that tuple."""
    if isinstance(r, dict):
        return r["draft_widths"], r["verify_width"], r["emitted"]
    return r


def round_cost(cm: CostModel, draft_widths, verify_width: int) -> float:
    """A round's price in plain steps: each draft forward by its width, the target's pass by its."""
    return sum(cm.draft_width(w) for w in draft_widths) + (cm.verify_width(verify_width) if verify_width else 0.0)


def price(rounds, cm: CostModel) -> tuple[int, float]:
    """(tokens emitted, plain steps) of a list of rounds (dicts or (draft_widths, verify_width, emitted))."""
    tokens, cost = 0, 0.0
    for r in rounds:
        dw, v, e = round_parts(r)
        tokens += e
        cost += round_cost(cm, dw, v)
    return tokens, cost


def projected_speedup(rounds, cm: CostModel) -> float | None:
    """Speed-up over plain decoding (one plain step a token) of the recorded rounds under `cm`."""
    tokens, cost = price(rounds, cm)
    return tokens / cost if cost > 0 else None
