"""Every number a user can set, checked in one place: for the CLI, the Python API and a server.

Each rule is a plain function `check(name, value)` over the registry `RULES`: it
returns the value (ints stay ints, numbers become floats) or raises `BadValue`, an
`MlxspecError` whose one line reads "<name> <rule>, got <value>", e.g.

    top_p must be > 0 and <= 1 (1 = off), got 2.0

The CLI's options use the same rules through `Checked` (a click type), so a bad
value is refused while the command line is parsed, before anything is loaded,
as a usage error (exit 2) in the same words under the option's name:

    error: Invalid value for '--top-p': must be > 0 and <= 1 (1 = off), got 2

Names are the Python API's keywords (`top_p`); the CLI spells them `--top-p`.
The shared click options (`model_options`, `sampling_options`, `draft_options`,
`max_tokens_option`, `max_kv_size_option`) live here too, so `generate`, `chat`,
`serve` and `bench` agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import click

from .errors import MlxspecError

MAX_NUM_DRAFT = 16
KV_KEEP = 4  # positions a bounded KV cache always keeps (kv_window.KEEP, mlx-lm's)
# --max-kv-size: the kept positions plus a window that holds at least one whole verify
# pass (the pending token and MAX_NUM_DRAFT drafts); smaller windows are typos, not settings
MIN_KV_SIZE = KV_KEEP + 1 + MAX_NUM_DRAFT


class BadValue(MlxspecError, ValueError):
    """A setting out of its range; `rule` is the message without the name and value."""

    def __init__(self, name: str, rule: str, value, message: str | None = None):
        self.name, self.rule, self.value = name, rule, value
        super().__init__(message or f"{name} {rule}, got {value!r}")


@dataclass(frozen=True)
class Rule:
    kind: type  # int or float
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is refused
    high_open: bool = False
    words: str = ""  # what the value means at its edges, e.g. "(0 = greedy)"
    keywords: tuple = ()  # words accepted besides numbers, e.g. ("auto",)

    def describe(self) -> str:
        what = "a whole number" if self.kind is int else "a number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {_fmt(self.low)}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '<='} {_fmt(self.high)}")
        text = f"must be {what}" + (" " + " and ".join(bounds) if bounds else "")
        if self.keywords:
            text += ", or " + " or ".join(repr(k) for k in self.keywords)
        return text + (f" {self.words}" if self.words else "")

    def check(self, name: str, value):
        if isinstance(value, str) and value in self.keywords:
            return value
        given = value  # errors quote the value as it was given
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadValue(name, self.describe(), given)
        if self.kind is int:
            if isinstance(value, float):
                raise BadValue(name, self.describe(), given)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise BadValue(name, self.describe(), given)
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise BadValue(name, self.describe(), given)
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise BadValue(name, self.describe(), given)
        return value


def _fmt(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


RULES = {
    "temp": Rule(float, 0, words="(0 = greedy)"),
    "top_p": Rule(float, 0, 1, low_open=True, words="(1 = off)"),
    "top_k": Rule(int, 0, words="(0 = off)"),
    "min_p": Rule(float, 0, 1, high_open=True, words="(0 = off)"),
    "repetition_penalty": Rule(float, 0, low_open=True, words="(1 = off)"),
    "repetition_context_size": Rule(int, 1),
    "seed": Rule(int, 0, 2**64 - 1),
    "max_tokens": Rule(int, 1),
    "num_draft": Rule(int, 0, MAX_NUM_DRAFT, words="(0 = plain decoding)", keywords=("auto",)),
    "num_draft_max": Rule(int, 0, MAX_NUM_DRAFT, words="(0 = plain decoding)"),
    "p_min": Rule(float, 0, 1),
    "draft_vocab": Rule(int, 0, words="(0 = the whole vocabulary)", keywords=("full",)),
    "context": Rule(int, 1),
    "max_kv_size": Rule(int, MIN_KV_SIZE, words=f"(KV cache positions: the first {KV_KEEP} and the latest ones)"),
    "budget": Rule(float, 0, low_open=True, words="(GiB)"),
    "repeats": Rule(int, 1),
}


def check(name: str, value):
    """`value` if it is a valid `name` (None always is: the default), else BadValue."""
    if value is None:
        return None
    return RULES[name].check(name, value)


def check_all(**values) -> dict:
    """check() each keyword; the checked values."""
    return {name: check(name, v) for name, v in values.items()}


# -- click ------------------------------------------------------------------------------


class Checked(click.ParamType):
    """A click type for RULES[name]: parses the text, then applies the rule."""

    def __init__(self, name: str):
        self.rule_name = name
        self.rule = RULES[name]
        self.name = "|".join(self.rule.keywords + ("integer" if self.rule.kind is int else "number",))

    def convert(self, value, param, ctx):
        if value is None or not isinstance(value, str):
            raw = value
        else:
            raw = value.strip()
            if raw not in self.rule.keywords:
                try:
                    raw = self.rule.kind(raw)
                except ValueError:
                    try:  # "1e3" for an int, say: refused below with the rule's words
                        raw = float(raw)
                    except ValueError:
                        self.fail(f"{self.rule.describe()}, got {value!r}", param, ctx)
        try:
            return check(self.rule_name, raw)
        except BadValue as e:
            self.fail(f"{e.rule}, got {value}", param, ctx)


def typed(name: str) -> Checked:
    return Checked(name)


BUILT_IN_DRAFTERS = ("model", "hybrid", "none")  # make_drafter's own; the rest come from drafters.DRAFTERS


def drafter_names() -> tuple:
    from .drafters import DRAFTERS

    return BUILT_IN_DRAFTERS + tuple(DRAFTERS)


def check_drafter(value):
    """A drafter name (or None: the default), else BadValue."""
    if value is None:
        return None
    names = drafter_names()
    if not isinstance(value, str) or value not in names:
        from .untrusted import printable

        message = f"unknown drafter {printable(repr(value))}: choose one of {', '.join(names)}"
        raise BadValue("drafter", "", value, message)
    return value


def _drafter_option(ctx, param, value):
    try:
        return check_drafter(value)
    except BadValue as e:
        raise click.BadParameter(str(e))


def model_options(f):
    """--model/--draft/--no-draft, shared by generate, chat, bench and calibrate."""
    f = click.option("--no-draft", is_flag=True, help="Plain target decoding (same code path, for comparisons).")(f)
    f = click.option("--draft", "--draft-model", "draft", default=None,
                     help="Draft model (folder, .gguf, catalog name or cached repo id); --draft-model is "
                          "mlx-lm's spelling.")(f)
    f = click.option("--model", "model", default=None,
                     help="Target model or pair folder (default: the Qwen2.5-Coder 1.5B/0.5B pair).")(f)
    return f


def sampling_options(f):
    """--temp/--top-p/--top-k/--min-p/--repetition-penalty/--seed, shared by generate and chat."""
    f = click.option("--seed", type=typed("seed"), default=None,
                     help="Random seed: the same seed gives the same output.")(f)
    f = click.option("--repetition-penalty", type=typed("repetition_penalty"), default=1.0, show_default=True,
                     help="Penalise recently seen tokens (1 = off).")(f)
    f = click.option("--min-p", type=typed("min_p"), default=0.0, show_default=True,
                     help="Drop tokens below this fraction of the top token's probability (0 = off).")(f)
    f = click.option("--top-k", type=typed("top_k"), default=0, show_default=True,
                     help="Sample from the k most likely tokens (0 = off).")(f)
    f = click.option("--top-p", type=typed("top_p"), default=1.0, show_default=True,
                     help="Sample from the smallest set of tokens holding this much probability (1 = off).")(f)
    f = click.option("--temp", type=typed("temp"), default=0.0, show_default=True, help="0 = greedy.")(f)
    return f


def sampling_kwargs(o) -> dict:
    return dict(temp=o["temp"], top_p=o["top_p"], top_k=o["top_k"], min_p=o["min_p"],
                repetition_penalty=o["repetition_penalty"], seed=o["seed"])


NUM_DRAFT_HELP = ("Draft tokens per round (0-16), or 'auto' (the default): draft token by token while the "
                  "calibrated cost model says it pays, falling back to plain decoding when it does not.")


def draft_options(f):
    """--num-draft/--num-draft-max/--drafter/--draft-p-min/--draft-vocab/--tree, shared by generate and chat."""
    f = click.option("--tree/--no-tree", "tree", default=None,
                     help="Verify draft trees (several continuations per target pass, sized by the cost model; "
                          "the default where the models support it) or single chains (--no-tree).")(f)
    f = click.option("--draft-vocab", type=typed("draft_vocab"), default=None,
                     help="Tokens the draft's head scores: the N most frequent (FR-Spec; default "
                          "65536 when the vocabulary is larger), or 'full'.")(f)
    f = click.option("--draft-p-min", type=typed("p_min"), default=0.0,
                     help="Stop drafting when the draft's probability of its token is below this.")(f)
    f = click.option("--drafter", default=None, callback=_drafter_option,
                     help="model | hybrid (prompt lookup, then the draft model) | lookup (prompt n-grams, no "
                          "draft model) | layerskip (the target with layers skipped) | none (default: model "
                          "when a draft is loaded).")(f)
    f = click.option("--num-draft-max", type=typed("num_draft_max"), default=None,
                     help="With --num-draft auto: the most tokens drafted per round "
                          "(default 12; 0 = plain decoding).")(f)
    f = click.option("--num-draft", "--num-draft-tokens", "num_draft", type=typed("num_draft"), default=None,
                     help=NUM_DRAFT_HELP + " (--num-draft-tokens: mlx-lm's spelling)")(f)
    return f


MAX_KV_SIZE_HELP = ("Bound each attention layer's KV cache to N positions, the first 4 and the latest ones "
                    "(mlx-lm's --max-kv-size): memory stays flat however long the text grows; the limit on "
                    "tokens is still the model's context.  Rounds verify chains (token trees need a full cache).")


def max_kv_size_option(f):
    """--max-kv-size, shared by generate, chat and serve."""
    return click.option("--max-kv-size", "max_kv_size", type=typed("max_kv_size"), default=None,
                        help=MAX_KV_SIZE_HELP)(f)


def max_tokens_option(default: int, help: str = "Most tokens to generate."):
    return click.option("--max-tokens", "-m", type=typed("max_tokens"), default=default, show_default=True, help=help)
