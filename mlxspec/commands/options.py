"""The click options shared by `generate`, `chat`, `serve`, `bench` and `calibrate`:
every value checked by core/options.py's rules while the command line is parsed
(a usage error, exit 2, before anything is loaded)."""

from __future__ import annotations

import click

from ..core.options import RULES, BadValue, check
from ..drafting.registry import check_drafter

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


def _drafter_option(ctx, param, value):
    try:
        return check_drafter(value)
    except BadValue as e:
        raise click.BadParameter(str(e))


def _dtype_option(ctx, param, value):
    from ..device import request_dtype

    request_dtype(value)  # before anything is loaded: every model of this command computes in it
    return value


PAIR_HELP = ("A pair: a pair folder (from `mlxspec convert`) or TARGET,DRAFT (each as --model/--draft take "
             "it). The same as --model/--draft-model, mlx-lm's spelling.")


def split_pair(pair: str | None, model: str | None, draft: str | None) -> tuple[str | None, str | None]:
    """--pair into (model, draft): a folder is --model's, TARGET,DRAFT both; never beside them."""
    if not pair:
        return model, draft
    if model or draft:
        raise click.UsageError("give either --pair or --model/--draft, not both")
    if "," in pair:
        t, d = (s.strip() for s in pair.split(",", 1))
        if not t or not d:
            raise click.BadParameter("TARGET,DRAFT with both named, or a pair folder", param_hint="'--pair'")
        return t, d
    return pair, None


def model_options(f):
    """--model/--draft/--pair/--no-draft/--dtype, shared by generate, chat, serve, bench and calibrate:
    one way to name a pair in every command (--pair is turned into model/draft here)."""
    import functools

    inner = f

    @functools.wraps(inner)
    def f(*args, pair=None, **kwargs):
        if pair:
            kwargs["model"], kwargs["draft"] = split_pair(pair, kwargs.get("model"), kwargs.get("draft"))
        return inner(*args, **kwargs)

    f.__click_params__ = list(getattr(inner, "__click_params__", []))
    f = click.option("--pair", "pair", default=None, metavar="PAIR", help=PAIR_HELP)(f)
    f = click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None,
                     expose_value=False, callback=_dtype_option,
                     help="What the models compute in (default: float32 on the CPU backend, the weights' "
                          "own dtype on a GPU); the Linux CPU kernels are float32 only.")(f)
    f = click.option("--no-draft", is_flag=True, help="Plain target decoding (same code path, for comparisons).")(f)
    f = click.option("--draft", "--draft-model", "draft", default=None,
                     help="Draft model (folder, .gguf, catalog name or cached repo id); --draft-model is "
                          "mlx-lm's spelling.")(f)
    f = click.option("--model", "model", default=None,
                     help="Target model or pair folder (default: the Qwen2.5-Coder 1.5B/0.5B pair).")(f)
    return f


def sampling_options(f):
    """--temp/--top-p/--top-k/--min-p/--repetition-penalty/--seed/--sampling, shared by generate, chat and serve."""
    f = sampling_choice_option(f)
    f = click.option("--logit-bias", "logit_bias", multiple=True, callback=_logit_bias_option, metavar="ID=BIAS",
                     help="Add BIAS (-100..100) to token ID's logit, as OpenAI's logit_bias (repeatable).")(f)
    f = click.option("--frequency-penalty", type=typed("frequency_penalty"), default=0.0, show_default=True,
                     help="OpenAI's: lower a token's logit by this much per time it was generated (0 = off).")(f)
    f = click.option("--presence-penalty", type=typed("presence_penalty"), default=0.0, show_default=True,
                     help="OpenAI's: lower the logit of every token generated before by this much (0 = off).")(f)
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
                repetition_penalty=o["repetition_penalty"], seed=o["seed"], sampling=o.get("sampling"),
                presence_penalty=o.get("presence_penalty") or 0.0, frequency_penalty=o.get("frequency_penalty") or 0.0,
                logit_bias=o.get("logit_bias") or ())


def _logit_bias_option(ctx, param, values):
    """--logit-bias ID=BIAS ... as ((id, bias), ...), by core/options.py's rule."""
    from ..core.options import check_logit_bias

    pairs = []
    for v in values:
        tid, sep, bias = v.partition("=")
        try:
            pairs.append((tid.strip(), float(bias)))
        except ValueError:
            sep = ""
        if not sep:
            raise click.BadParameter(f"must be ID=BIAS (a token id and a number), got {v!r}")
    try:
        return check_logit_bias(pairs, "--logit-bias")
    except BadValue as e:
        raise click.BadParameter(f"{e.rule}, got {e.value!r}")


SAMPLING_HELP = ("How speculation samples at --temp > 0: coupled (Gumbel noise fixed by the seed and the "
                 "token's position: the same seed gives plain decoding's text token for token, whatever is "
                 "drafted; the default with --seed) or rejection (speculative rejection sampling; the "
                 "default without --seed).  Both are exact.")


def sampling_choice_option(f):
    """--sampling coupled|rejection (core/coupled.py), in sampling_options and bench."""
    return click.option("--sampling", "sampling", type=click.Choice(["coupled", "rejection"]), default=None,
                        help=SAMPLING_HELP)(f)


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


def kv_bits_options(f):
    """--kv-bits/--kv-group-size (mlx-lm's spelling), shared by generate, chat and serve."""
    f = click.option("--kv-group-size", "kv_group_size", type=typed("kv_group_size"), default=64, show_default=True,
                     help="With --kv-bits: values sharing one scale and bias.")(f)
    f = click.option("--kv-bits", "kv_bits", type=typed("kv_bits"), default=None,
                     help="Quantize the target's KV cache to 4 or 8 bits after the prompt (mlx-lm's --kv-bits with "
                          "--quantized-kv-start 0): the output is mlx-lm's with that cache.")(f)
    return f


def max_tokens_option(default: int, help: str = "Most tokens to generate."):
    return click.option("--max-tokens", "-m", type=typed("max_tokens"), default=default, show_default=True, help=help)
