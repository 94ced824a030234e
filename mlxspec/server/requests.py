"""`mlxspec serve`: an HTTP request body, checked field by field, into a `GenRequest`.

Numbers follow the same rules (core/options.py) as the CLI and the Python API.  Every
malformed request is a `RequestError` carrying what the OpenAI API puts in
its error object (message, param, code) and the HTTP status, raised before the
request takes a place in the generation queue.  A field that would change what
an app gets back but that this server does not implement (`tools`,
`response_format`, `logprobs`, a non-zero penalty, `n` > 1, ...: `UNSUPPORTED`)
is a 400 naming it, never a silent 200 with something else; fields that change
nothing in the reply (`user`, `metadata`, `store`, ...) are ignored.  Served:
`logprobs`/`top_logprobs` (read off the verify pass), `presence_penalty`,
`frequency_penalty` and `logit_bias` (logits processing shared by target and draft:
core/sampling.py), `tools`/`tool_choice` (the chat template's tools and the
model's tool-call format: server/tools.py), `response_format` json_object and
json_schema (a constraint on target and draft alike: server/formats.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import MlxspecError
from ..core.sampling import SamplingParams
from ..util.untrusted import printable
from .formats import parse_response_format

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
# Fields an app may set that would change the reply, which this server does not implement.  Each is
# refused when set to anything but its "off" value (null always counts as off).
UNSUPPORTED = {  # field: the values that leave the reply unchanged
    "functions": ([],), "function_call": ("none",), "best_of": (1,), "echo": (False,), "suffix": ("",), "modalities": (["text"],), "audio": (),
    "prediction": (), "web_search_options": (), "reasoning_effort": (), "guided_json": (), "guided_regex": (),
    "guided_choice": (), "guided_grammar": (), "json_schema": (), "grammar": (),
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind
        self.headers = headers or {}  # extra response headers (Retry-After)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class GenRequest:
    kind: str  # "chat" or "completion"
    model: str | None
    messages: list | None  # chat: [{"role", "content"}] with text content
    prompt: str | list | None  # completion: text or token ids
    max_tokens: int | None  # None: the server's default (capped by the context)
    sampling: dict  # SamplingParams fields the request set
    stop: list = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    num_draft: int | str | None = None  # None: the server's policy; 0: no drafting; "auto"
    logprobs: int | None = None  # None: not asked; N: each token's logprob and its top N alternatives
    tools: list | None = None  # chat: OpenAI's tools, for the chat template (tool_choice "none": None)
    parallel_tool_calls: bool = True
    tool_format: object = None  # set by encode(): the model's tool-call format (server/tools.py)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RequestError(f"the request body is not valid JSON ({printable(str(e), 120)})", code="invalid_json")
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {_type(body)}", code="invalid_json")
    try:  # a \ud800-style escape decodes to a lone surrogate, which no tokenizer can encode
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError("the request body has a string with a lone surrogate escape (invalid Unicode)",
                           code="invalid_json")
    return body


def _type(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), type(v).__name__)


def _wrong(name: str, want: str, v) -> RequestError:
    return RequestError(f"'{name}' must be {want}, got {_type(v)} {printable(json.dumps(v)[:40])}",
                        param=name, code="invalid_type")


def _setting(body: dict, field: str, rule: str | None = None):
    """body[field] checked by core/options.py's rule for `rule` (the same rule as the CLI
    and the Python API), or None when absent."""
    from ..core.options import BadValue, check

    v = body.get(field)
    if v is None:
        return None
    try:
        return check(rule or field, v)
    except BadValue as e:
        code = "invalid_type" if isinstance(v, bool) or not isinstance(v, (int, float)) else "invalid_value"
        raise RequestError(f"'{field}' {e.rule}, got {printable(json.dumps(v)[:40])}", param=field, code=code)


def _bool(body: dict, name: str, default=False) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _wrong(name, "a boolean", v)
    return v


def _text(content, name: str) -> str:
    """Message content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise RequestError(f"'{name}[{i}]' must be a text part {{\"type\": \"text\", \"text\": \"...\"}} "
                                   "(this server reads text only)", param=name, code="invalid_type")
            parts.append(p["text"])
        return "".join(parts)
    raise _wrong(name, "a string or a list of text parts", content)


def parse_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise RequestError("'messages' is required: a list of {\"role\", \"content\"} objects",
                           param="messages", code="missing_required_parameter")
    if not isinstance(msgs, list):
        raise _wrong("messages", "an array", msgs)
    if not msgs:
        raise RequestError("'messages' must not be empty", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _wrong(where, "an object", m)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"'{where}.role' must be one of {', '.join(ROLES)}, got "
                               f"{printable(json.dumps(role)[:40])}", param=f"{where}.role", code="invalid_value")
        content = m.get("content")
        text = "" if content is None and role == "assistant" else _text(content, f"{where}.content")
        msg = {"role": ROLES[role], "content": text}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
        out.append(msg)
    return out


def _tool_calls(calls, where: str) -> list:
    """An assistant message's earlier tool calls, for the chat template: arguments as objects
    (templates write them with tojson), as mlx-lm's server passes them."""
    if not isinstance(calls, list):
        raise _wrong(where, "an array", calls)
    out = []
    for i, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"'{where}[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                               "\"arguments\"}}", param=where, code="invalid_type")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                pass  # left as the model wrote it
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_tools(body: dict, kind: str) -> tuple[list | None, bool, object]:
    """(tools for the chat template, or None; parallel_tool_calls; the constraint of a forced call or None)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = _bool(body, "parallel_tool_calls", True)
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise RequestError("'tool_choice' names a tool but there are no 'tools'", param="tool_choice",
                               code="invalid_value")
        return None, parallel, None
    if kind != "chat":
        raise RequestError("'tools' works with /v1/chat/completions only", param="tools", code="unsupported_parameter")
    if not isinstance(tools, list):
        raise _wrong("tools", "an array", tools)
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"]):
            raise RequestError(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                               "\"description\", \"parameters\"}}}}", param=f"tools[{i}]", code="invalid_type")
    if choice == "none":
        return None, parallel, None  # the model is not told of the tools, so it answers in text
    if choice in (None, "auto"):
        return tools, parallel, None
    from .tools import forced_call

    try:
        return tools, parallel, forced_call(tools, choice)  # "required" or a named function
    except ValueError as e:
        raise RequestError(e.args[0], param=e.args[1], code="invalid_value")


def parse_logprobs(body: dict, kind: str) -> int | None:
    """Chat: logprobs true (+ top_logprobs 0-20); completions: logprobs N (0-20)."""
    if kind == "chat":
        want, top = _bool(body, "logprobs"), body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
                raise RequestError(f"'top_logprobs' must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got "
                                   f"{printable(json.dumps(top)[:40])}", param="top_logprobs", code="invalid_value")
            if top and not want:
                raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs",
                                   code="invalid_value")
        return (top or 0) if want else None
    n = body.get("logprobs")
    if n is None or n is False:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise RequestError(f"'logprobs' must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got "
                           f"{printable(json.dumps(n)[:40])}", param="logprobs", code="invalid_value")
    return n


def parse_prompt(body: dict):
    p = body.get("prompt")
    if p is None:
        raise RequestError("'prompt' is required: text or a list of token ids", param="prompt",
                           code="missing_required_parameter")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise RequestError("'prompt' must not be empty", param="prompt", code="invalid_value")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    if isinstance(p, list) and p and all(isinstance(t, (str, list)) for t in p):
        raise RequestError("one prompt per request: this server does not batch", param="prompt", code="invalid_value")
    raise _wrong("prompt", "a string or a non-empty list of token ids", p)


def parse_stop(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    stops = [s] if isinstance(s, str) else s
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise _wrong("stop", "a string or a list of strings", s)
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", param="stop",
                           code="invalid_value")
    return [x for x in stops if x]


def _off(v, offs) -> bool:
    return v is None or any(type(v) is type(o) and v == o or (type(o) is int and type(v) is float and v == o)
                            for o in offs)


def check_unsupported(body: dict) -> None:
    """A 400 naming the first field that asks for something this server does not do."""
    for name, offs in UNSUPPORTED.items():
        if name in body and not _off(body[name], offs):
            raise RequestError(f"'{name}' is not supported by mlxspec serve (got "
                               f"{printable(json.dumps(body[name])[:40])}); leave it out", param=name,
                               code="unsupported_parameter")


def parse_request(kind: str, body: dict) -> GenRequest:
    """Check every field this server reads; the first problem is a RequestError."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _wrong("model", "a string", model)
    messages = parse_messages(body) if kind == "chat" else None
    prompt = parse_prompt(body) if kind == "completion" else None
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise RequestError(f"'n' is not supported by mlxspec serve beyond 1 (one completion per request), got "
                           f"{printable(json.dumps(n)[:40])}", param="n", code="unsupported_parameter")
    check_unsupported(body)
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are given
        v = _setting(body, name, "max_tokens")
        if v is not None:
            max_tokens = v
    sampling = {}
    for name, key in (("temperature", "temp"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"),
                      ("repetition_penalty", "repetition_penalty"), ("seed", "seed"), ("sampling", "sampling"),
                      ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty")):
        v = _setting(body, name, key)
        if v is not None:
            sampling[key] = v
    if body.get("logit_bias") is not None:
        from ..core.options import BadValue, check_logit_bias

        try:
            sampling["logit_bias"] = check_logit_bias(body["logit_bias"])
        except BadValue as e:
            raise RequestError(f"'logit_bias' {e.rule}, got {printable(json.dumps(e.value, default=str)[:40])}",
                               param="logit_bias", code="invalid_value")
    logprobs = parse_logprobs(body, kind)
    tools, parallel, constraint = parse_tools(body, kind)
    if constraint is not None and body.get("response_format") not in (None, {"type": "text"}):
        raise RequestError("'response_format' and a forced 'tool_choice' do not go together (the reply is a tool call)",
                           param="response_format", code="invalid_value")
    constraint = constraint or parse_response_format(body, lambda m, p, c: RequestError(m, param=p, code=c))
    if constraint is not None:
        sampling["constraint"] = constraint  # bound to the tokenizer by encode()
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _wrong("stream_options", "an object", opts)
    include_usage = _bool(opts or {}, "include_usage") if opts else False
    return GenRequest(kind, model, messages, prompt, max_tokens, sampling, parse_stop(body), stream,
                      include_usage, _setting(body, "num_draft_tokens", "num_draft"), logprobs, tools, parallel)


def sampling_params(defaults: SamplingParams, req: GenRequest) -> SamplingParams:
    import dataclasses

    try:
        return dataclasses.replace(defaults, **req.sampling)
    except ValueError as e:
        raise RequestError(str(e), code="invalid_value")


def encode(pair, req: GenRequest) -> list[int]:
    """The request's prompt as token ids: the chat template over the messages
    (as `mlxspec generate` templates its prompt), raw text, or checked ids."""
    from ..api import encode_prompt
    from .tools import can_force, tool_format

    if req.sampling.get("constraint") is not None:  # the JSON constraint learns the vocabulary (once per tokenizer)
        req.sampling["constraint"].bind(pair.tokenizer, pair.eos_token_ids)
    bias = req.sampling.get("logit_bias") or ()
    if bias and pair.vocab_size is not None and bias[-1][0] >= pair.vocab_size:
        raise RequestError(f"'logit_bias' names token id {bias[-1][0]}, past the vocabulary ({pair.vocab_size} ids)",
                           param="logit_bias", code="invalid_value")
    if req.tools:
        req.tool_format = tool_format(pair.tokenizer)
        if req.tool_format is None:
            raise RequestError("'tools' is not supported by mlxspec serve for this model: its chat template and "
                               "tokenizer have no tool-call format (mlx-lm finds none); leave it out", param="tools",
                               code="unsupported_parameter")
        if getattr(req.sampling.get("constraint"), "forced_tool_call", False) and not can_force(req.tool_format):
            raise RequestError("'tool_choice' \"required\" or a named function is supported by mlxspec serve for models "
                               "whose tool calls are <tool_call>{json}</tool_call> only (Qwen's); use \"auto\"",
                               param="tool_choice", code="unsupported_parameter")
    try:
        if req.kind == "chat":
            return encode_prompt(pair.tokenizer, req.messages, vocab_size=pair.vocab_size, tools=req.tools)
        return encode_prompt(pair.tokenizer, req.prompt, chat_template=False, vocab_size=pair.vocab_size)
    except MlxspecError as e:
        raise RequestError(str(e), param="messages" if req.kind == "chat" else "prompt", code="invalid_prompt")


def fit_context(n_prompt: int, max_tokens: int | None, default_max: int, context: int | None) -> int:
    """The number of tokens to generate, or a RequestError when prompt and
    max_tokens do not fit the model's context."""
    if n_prompt == 0:
        raise RequestError("the prompt encodes to no tokens", param="prompt", code="invalid_prompt")
    if context is None:
        return max_tokens or default_max
    if n_prompt >= context:
        raise RequestError(f"the prompt is {n_prompt} tokens but the model's context is {context}: shorten it",
                           param="messages", code="context_length_exceeded")
    if max_tokens is None:
        return min(default_max, context - n_prompt)
    if n_prompt + max_tokens > context:
        raise RequestError(f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
                           f"context ({context} tokens): ask for at most {context - n_prompt}",
                           param="max_tokens", code="context_length_exceeded")
    return max_tokens
