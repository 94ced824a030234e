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
`max_tokens_option`, `max_kv_size_option`) are in commands/options.py, so
`generate`, `chat`, `serve` and `bench` agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import MlxspecError

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


@dataclass(frozen=True)
class Choice:
    """A rule for a word from a fixed set (None: the default)."""

    choices: tuple
    words: str = ""
    kind: type = str
    keywords: tuple = ()

    def describe(self) -> str:
        return "must be " + " or ".join(repr(c) for c in self.choices) + (f" {self.words}" if self.words else "")

    def check(self, name: str, value):
        if value is None or (isinstance(value, self.kind) and not isinstance(value, bool) and value in self.choices):
            return value
        raise BadValue(name, self.describe(), value)


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
    "presence_penalty": Rule(float, -2, 2, words="(0 = off; OpenAI's range)"),
    "frequency_penalty": Rule(float, -2, 2, words="(0 = off; OpenAI's range)"),
    "logit_bias_value": Rule(float, -100, 100, words="(added to the token's logit)"),
    "sampling": Choice(("coupled", "rejection"), words="(default: coupled with a seed, else rejection)"),
    "max_tokens": Rule(int, 1),
    "num_draft": Rule(int, 0, MAX_NUM_DRAFT, words="(0 = plain decoding)", keywords=("auto",)),
    "num_draft_max": Rule(int, 0, MAX_NUM_DRAFT, words="(0 = plain decoding)"),
    "p_min": Rule(float, 0, 1),
    "draft_vocab": Rule(int, 0, words="(0 = the whole vocabulary)", keywords=("full",)),
    "context": Rule(int, 1),
    "max_kv_size": Rule(int, MIN_KV_SIZE, words=f"(KV cache positions: the first {KV_KEEP} and the latest ones)"),
    "kv_bits": Choice((4, 8), kind=int, words="(bits per value of the target's quantized KV cache)"),
    "kv_group_size": Choice((32, 64, 128), kind=int, words="(KV cache values sharing one scale)"),
    "budget": Rule(float, 0, low_open=True, words="(GiB)"),
    "repeats": Rule(int, 1),
}


def check(name: str, value):
    """`value` if it is a valid `name` (None always is: the default), else BadValue."""
    if value is None:
        return None
    return RULES[name].check(name, value)


MAX_LOGIT_BIAS = 1024  # entries


def check_logit_bias(value, name: str = "logit_bias") -> tuple:
    """OpenAI's logit_bias -- {token id (a string of digits or an int): bias in -100..100} or
    ((id, bias), ...) -- as a sorted tuple of (int id, float bias); BadValue naming the entry."""
    items = value.items() if isinstance(value, dict) else value
    try:
        items = list(items or ())
    except TypeError:
        raise BadValue(name, "must be an object {token id: bias}", value)
    if len(items) > MAX_LOGIT_BIAS:
        raise BadValue(name, f"takes at most {MAX_LOGIT_BIAS} token ids", f"{len(items)} entries")
    out = {}
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise BadValue(name, "must be an object {token id: bias}", value)
        t, b = item
        tid = int(t) if isinstance(t, str) and t.isascii() and t.isdigit() else t
        if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
            raise BadValue(name, "keys must be token ids (whole numbers >= 0, as strings in JSON)", t)
        out[tid] = RULES["logit_bias_value"].check(f"{name}[{t}]", b)
    return tuple(sorted(out.items()))


def check_all(**values) -> dict:
    """check() each keyword; the checked values."""
    return {name: check(name, v) for name, v in values.items()}
