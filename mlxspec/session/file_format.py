"""The session file: what `Session.save()` writes and `Session.load()` reads back.

A session file may come from anywhere (edited by hand, tampered with, cut
short), so loading checks every field before anything is built from it, and a
bad one is refused with one line naming the field:

    session file chat.json: field 'tokens[3]' must be an integer token id, got float 1.5

The token history gets two more checks once the model is loaded: every id must
be in the model's vocabulary (an id past the embedding table crashes MLX, see
core/token_ids.py), and the tokens must spell the stored `token_text` -- the text the
conversation's prompts and replies make -- when detokenized.  The text is
compared with whitespace and U+FFFD left out, since tokenizers legitimately
differ there (SentencePiece's leading spaces, clean-up of spaces before
punctuation, how a streaming detokenizer and `decode` replace invalid UTF-8), and
a swapped token almost always changes something else.  The messages themselves
need no comparison with the tokens: a turn reuses the token history only when
the template renders the messages as text that starts with `token_text`
(`Session.build_prompt`), otherwise it tokenizes the messages afresh.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from ..errors import MlxspecError
from ..core.options import RULES, BadValue, check_logit_bias
from ..core.sampling import SamplingParams

SAVE_FORMAT = "mlxspec.session.session"
SAVE_VERSION = 1
ROLES = ("system", "user", "assistant")
_MISSING = object()


def session_to_dict(session) -> dict:
    return {
        "format": SAVE_FORMAT,
        "version": SAVE_VERSION,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": str(session.pair.target_path),
        "draft_model": str(session.pair.draft_path) if session.pair.draft_path else None,
        "system": session.system,
        "messages": session.conversation(),
        "settings": {
            "sampling": session.params.to_dict(),
            "max_tokens": session.max_tokens,
            "draft": session.drafting,
            "num_draft": session.num_draft,
            "p_min": session._drafting.p_min,
            "on_cancel": session.on_cancel,
            "max_kv_size": session.max_kv_size,
            "chat_template": session.chat_template,
        },
        "tokens": session.tokens,
        "token_text": session._token_text,
        "stats": session.stats.to_dict(),
    }


def write_session_file(path, data: dict) -> Path:
    """Write `data` as JSON, atomically (a crash never leaves half a file)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# -- checking --------------------------------------------------------------------

def _kind(value) -> str:
    """A value's JSON type, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "number", str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _described(value) -> str:
    """'string "abc"', 'number 1.5', 'null', 'list' -- the type, and a short scalar."""
    if value is None or not isinstance(value, (str, int, float, bool)):
        return _kind(value)
    text = json.dumps(value, ensure_ascii=False)
    return f"{_kind(value)} {text if len(text) <= 40 else text[:37] + '...'}"


class _Checker:
    def __init__(self, path):
        self.path = path

    def fail(self, field: str, problem: str):
        raise MlxspecError(f"session file {self.path}: field '{field}' {problem}")

    def got(self, field: str, expected: str, value):
        self.fail(field, f"must be {expected}, got {_described(value)}")

    def get(self, obj: dict, key: str, field: str, required: bool = False):
        value = obj.get(key, _MISSING)
        if value is _MISSING and required:
            self.fail(field, "is missing")
        return value

    def string(self, value, field, nullable=False):
        if not (isinstance(value, str) or (nullable and value is None)):
            self.got(field, "a string" + (" or null" if nullable else ""), value)
        return value

    def integer(self, value, field, lo=None, nullable=False):
        if nullable and value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.got(field, "an integer" + (" or null" if nullable else ""), value)
        if lo is not None and value < lo:
            self.fail(field, f"must be at least {lo}, got {value}")
        return value

    def setting(self, value, field, name, nullable=False):
        """A value under core/options.py's rule for `name` (the CLI's and the API's), reported against `field`."""
        if nullable and value is None:
            return None
        try:
            return RULES[name].check(name, value)
        except BadValue as e:
            self.fail(field, f"{e.rule}{', or null' if nullable else ''}, got {_described(value)}")

    def obj(self, value, field):
        if not isinstance(value, dict):
            self.got(field, "an object", value)
        return value


_SAMPLING_TYPES = {f.name: f.type for f in dataclasses.fields(SamplingParams)
                   if f.name not in ("completion_start", "constraint")}  # the decoder's and a server's, not saved


def _check_sampling(c: _Checker, sampling) -> SamplingParams:
    c.obj(sampling, "settings.sampling")
    for key, value in sampling.items():
        field = f"settings.sampling.{key}"
        if key not in _SAMPLING_TYPES:
            c.fail(field, f"is not a sampling setting (known: {', '.join(_SAMPLING_TYPES)})")
        if key == "logit_bias":
            try:
                check_logit_bias(value, field)
            except BadValue as e:
                c.fail(field, f"{e.rule}, got {_described(e.value)}")
        else:
            c.setting(value, field, key, nullable=key == "seed")
    try:
        return SamplingParams(**sampling)
    except ValueError as e:
        c.fail("settings.sampling", f"is invalid: {e}")


def _check_settings(c: _Checker, settings) -> dict:
    """Session keyword arguments from the `settings` object (absent keys: defaults)."""
    c.obj(settings, "settings")
    kw = {}
    if (v := c.get(settings, "sampling", "settings.sampling")) is not _MISSING:
        kw["sampling"] = _check_sampling(c, v)
    if (v := c.get(settings, "max_tokens", "settings.max_tokens")) is not _MISSING:
        kw["max_tokens"] = c.setting(v, "settings.max_tokens", "max_tokens")
    if (v := c.get(settings, "draft", "settings.draft")) is not _MISSING:
        if not isinstance(v, bool):
            c.got("settings.draft", "true or false", v)
        kw["drafting"] = v  # the file keeps its field name "draft" (on/off)
    if (v := c.get(settings, "num_draft", "settings.num_draft")) is not _MISSING:
        kw["num_draft"] = c.setting(v, "settings.num_draft", "num_draft", nullable=True)
    if (v := c.get(settings, "p_min", "settings.p_min")) is not _MISSING:
        kw["p_min"] = c.setting(v, "settings.p_min", "p_min")
    if (v := c.get(settings, "on_cancel", "settings.on_cancel")) is not _MISSING:
        if v not in ("keep", "drop"):
            c.got("settings.on_cancel", "\"keep\" or \"drop\"", v)
        kw["on_cancel"] = v
    if (v := c.get(settings, "max_kv_size", "settings.max_kv_size")) is not _MISSING:
        kw["max_kv_size"] = c.setting(v, "settings.max_kv_size", "max_kv_size", nullable=True)
    if (v := c.get(settings, "chat_template", "settings.chat_template")) is not _MISSING:
        if not isinstance(v, bool):
            c.got("settings.chat_template", "true or false", v)
        kw["chat_template"] = v
    return kw


def _check_messages(c: _Checker, messages, system):
    """(system prompt, user/assistant messages) from the `messages` list, whose
    first entry may repeat the system prompt (as `conversation()` gives it)."""
    if not isinstance(messages, list):
        c.got("messages", "a list", messages)
    out = []
    for i, m in enumerate(messages):
        field = f"messages[{i}]"
        c.obj(m, field)
        role = c.string(c.get(m, "role", f"{field}.role", required=True), f"{field}.role")
        content = c.string(c.get(m, "content", f"{field}.content", required=True), f"{field}.content")
        if role not in ROLES:
            c.got(f"{field}.role", "\"system\", \"user\" or \"assistant\"", role)
        if role == "system":
            if i != 0:
                c.fail(f"{field}.role", "is \"system\", which only the first message may be")
            if system is _MISSING:
                system = content
            elif system != content:
                c.fail(f"{field}.content", "differs from field 'system'")
            continue
        out.append({"role": role, "content": content})
    return (None if system is _MISSING else system), out


def read_session_file(path) -> dict:
    """The checked contents of a session file: model, draft_model, system,
    messages (user/assistant), settings (Session keyword arguments), tokens
    (None when absent) and token_text.  Any problem: a one-line MlxspecError."""
    from ..util.untrusted import JSON_MAX_BYTES, JSON_MAX_DEPTH, nested_within, regular_file

    file = Path(path).expanduser()
    regular_file(file, "", JSON_MAX_BYTES, label=f"the session file {path}")  # no FIFO, device or huge file
    try:
        with open(file, "rb") as f:
            raw = f.read(JSON_MAX_BYTES + 1)
    except OSError as e:
        raise MlxspecError(f"cannot read the session file {path}: {e.strerror or e}") from e
    try:
        data = json.loads(raw.decode("utf-8"))
        if not nested_within(data, JSON_MAX_DEPTH):
            raise RecursionError
    except RecursionError:
        raise MlxspecError(f"session file {path} is nested too deeply (more than {JSON_MAX_DEPTH} levels); "
                           "is it a session file?") from None
    except UnicodeDecodeError as e:
        raise MlxspecError(f"session file {path} is not UTF-8 text (byte {e.start}); is it a session file?") from e
    except json.JSONDecodeError as e:
        raise MlxspecError(f"session file {path} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
    if not isinstance(data, dict):
        raise MlxspecError(f"session file {path} holds a JSON {_kind(data)}, not a session (a JSON object)")
    c = _Checker(path)
    fmt = c.get(data, "format", "format", required=True)
    if fmt != SAVE_FORMAT:
        c.fail("format", f"must be \"{SAVE_FORMAT}\", got {_described(fmt)}: not an mlxspec session file")
    version = c.integer(c.get(data, "version", "version", required=True), "version", lo=1)
    if version > SAVE_VERSION:
        c.fail("version", f"is {version}: the file was written by a newer mlxspec (this one reads up to {SAVE_VERSION})")
    if (v := data.get("saved_at")) is not None:
        c.string(v, "saved_at")
    out = {"model": c.string(c.get(data, "model", "model", required=True), "model")}
    if not out["model"]:
        c.fail("model", "is empty")
    out["draft_model"] = c.string(data.get("draft_model"), "draft_model", nullable=True)
    system = c.get(data, "system", "system")
    if system is not _MISSING:
        c.string(system, "system", nullable=True)
    out["system"], out["messages"] = _check_messages(c, c.get(data, "messages", "messages", required=True), system)
    out["settings"] = _check_settings(c, data.get("settings", {}))
    tokens = data.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, list):
            c.got("tokens", "a list of token ids", tokens)
        if not all(type(t) is int for t in tokens):
            for i, t in enumerate(tokens):
                if isinstance(t, bool) or not isinstance(t, int):
                    c.got(f"tokens[{i}]", "an integer token id", t)
        for i, t in enumerate(tokens):
            if t < 0:
                c.fail(f"tokens[{i}]", f"is {t}: token ids are never negative")
        out["token_text"] = c.string(c.get(data, "token_text", "token_text", required=True), "token_text")
    out["tokens"] = tokens
    if (v := data.get("stats")) is not None:
        c.obj(v, "stats")
    return out


def _letters(text: str) -> str:
    return "".join(ch for ch in text if not ch.isspace() and ch != "\ufffd")


def check_token_history(path, tokens: list[int], token_text: str, tokenizer, vocab_size: int | None):
    """The stored token history is usable with this model: every id embeddable,
    and the ids spell `token_text` (see the module docstring)."""
    c = _Checker(path)
    if vocab_size is not None:
        for i, t in enumerate(tokens):
            if t >= vocab_size:
                c.fail(f"tokens[{i}]", f"holds token id {t}, out of range for this model's vocabulary (0..{vocab_size - 1})")
    if _letters(tokenizer.decode(tokens) if tokens else "") != _letters(token_text):
        c.fail("tokens", "does not spell field 'token_text' when detokenized: the file was edited or is corrupt "
                         "(delete both fields to have the conversation tokenized afresh)")


def load_session(cls, path, pair=None, **overrides):
    """`Session.load`: the session saved at `path`, on `pair` (default: the saved models)."""
    data = read_session_file(path)
    if pair is None:  # the saved models, found locally: a session file never makes mlxspec download
        from ..models.loading import load, resolve_present

        try:
            target = resolve_present(data["model"])
            draft = resolve_present(data["draft_model"]) if data["draft_model"] else None
        except MlxspecError as e:
            raise MlxspecError(f"session file {path}: {e}; Session.load never downloads (or pass "
                               "pair=mlxspec.load(...) to continue it on another model)") from None
        pair = load(target, draft, no_draft=draft is None)
    kw = dict(system=data["system"], **data["settings"])
    if pair.draft is None:
        kw.pop("drafting", None)
    kw.update(overrides)
    session = cls(pair, **kw)
    session.messages = data["messages"]
    # the token history is the saved model's: another model re-tokenizes the conversation
    if data["tokens"] is not None and str(pair.target_path) == data["model"]:
        check_token_history(path, data["tokens"], data["token_text"], pair.tokenizer, pair.vocab_size)
        session._tokens, session._token_text = list(data["tokens"]), data["token_text"]
    return session
