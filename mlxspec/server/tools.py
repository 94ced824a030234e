"""`mlxspec serve`: tool calls (OpenAI's `tools`), as mlx-lm's server does them.

The request's `tools` go to the model's chat template (`apply_chat_template(...,
tools=...)`); the reply is then read for the tool-call markers of the model's
family and parsed by mlx-lm's own parser for it (mlx_lm.tokenizer_utils infers
both from the template: Qwen's `<tool_call>{json}</tool_call>`, Mistral's,
pythonic, ...).  Text outside the markers stays the message's content; each call
becomes `{"id", "type": "function", "function": {"name", "arguments": "<json>"}}`.
A model whose tokenizer has no tool-call format is refused (a 400 naming `tools`).
`tool_choice` "required" or {"type": "function", "function": {"name": ...}} forces a
call where the format is Qwen's (`<tool_call>{"name", "arguments"}</tool_call>`,
mlx-lm's json_tools): a JSON constraint (mlxspec/constrained/) on target and draft
alike, the name one of the tools' (or the one named), the arguments following that
tool's parameters schema (with several tools, any object).
`ToolStream` does the same on a stream: content is sent as it comes, except a tail
that could still open a tool call, and everything from a tool call's start on is
held until the end, then sent as `delta.tool_calls`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass


@dataclass
class ToolFormat:
    start: str
    end: str
    parser: object  # mlx-lm's parse_tool_call(text, tools) -> dict or list of dicts


def tool_format(tokenizer) -> ToolFormat | None:
    """The model's tool-call format (mlx-lm's TokenizerWrapper infers it), or None."""
    if not getattr(tokenizer, "has_tool_calling", False):
        return None
    start, end, parser = tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser
    if not start or parser is None:
        return None
    return ToolFormat(start, end or "", parser)


def _call(parsed: dict) -> dict:
    args = parsed.get("arguments", {})
    return {"id": parsed.get("id") or "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": str(parsed.get("name", "")),
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def parse_calls(fmt: ToolFormat, texts: list[str], tools) -> list[dict]:
    """Each marked text through the parser; one that does not parse (cut off by max_tokens,
    say) is left out, as mlx-lm does."""
    calls = []
    for t in texts:
        try:
            parsed = fmt.parser(t, tools)
        except Exception:  # the parser is mlx-lm's; a malformed call is the model's, not a server error
            continue
        for p in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(p, dict) and p.get("name"):
                calls.append(_call(p))
    return calls


def split_tool_calls(text: str, fmt: ToolFormat, tools) -> tuple[str, list[dict]]:
    """(the text outside tool calls, the calls)."""
    content, marked, rest = [], [], text
    while True:
        i = rest.find(fmt.start)
        if i < 0:
            content.append(rest)
            break
        content.append(rest[:i])
        rest = rest[i + len(fmt.start):]
        j = rest.find(fmt.end) if fmt.end else -1
        if j < 0:
            marked.append(rest)
            break
        marked.append(rest[:j])
        rest = rest[j + len(fmt.end):]
    return "".join(content), parse_calls(fmt, marked, tools)


class ToolStream:
    """Streamed content with tool calls held back (see the module docstring)."""

    def __init__(self, fmt: ToolFormat, tools):
        self.fmt, self.tools = fmt, tools
        self.held = ""  # a tail that may open a tool call
        self.calling = ""  # everything from the first tool call's start on

    def feed(self, text: str) -> str:
        """The content that is safe to send now."""
        if self.calling:
            self.calling += text
            return ""
        buf = self.held + text
        i = buf.find(self.fmt.start)
        if i >= 0:
            self.calling, self.held = buf[i:], ""
            return buf[:i]
        keep = 0
        for n in range(min(len(self.fmt.start) - 1, len(buf)), 0, -1):
            if buf.endswith(self.fmt.start[:n]):
                keep = n
                break
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def finish(self) -> tuple[str, list[dict]]:
        """(content still held, the tool calls)."""
        if not self.calling:
            out, self.held = self.held, ""
            return out, []
        content, calls = split_tool_calls(self.calling, self.fmt, self.tools)
        return self.held + content, calls


JSON_TOOLS = ("<tool_call>", "</tool_call>")  # the format a call can be forced in: "<tool_call>\n{json}\n</tool_call>"


def forced_call(tools: list, choice):
    """A JsonConstraint that makes the reply one tool call (see the module docstring), or a
    ValueError saying why not (its args: message, param)."""
    from ..constrained.json_machine import SchemaError
    from ..constrained.mask import JsonConstraint

    fns = [t["function"] for t in tools]
    if choice == "required":
        chosen = fns
    else:
        fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        chosen = [f for f in fns if f["name"] == name]
        if not chosen:
            raise ValueError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": <one of the tools>}}", "tool_choice")
    args = chosen[0].get("parameters") or {"type": "object"} if len(chosen) == 1 else {"type": "object"}
    schema = {"type": "object", "required": ["name", "arguments"],
              "properties": {"name": {"enum": [f["name"] for f in chosen]}, "arguments": args}}
    try:
        c = JsonConstraint(schema, (JSON_TOOLS[0] + "\n").encode(), ("\n" + JSON_TOOLS[1]).encode())
    except SchemaError as e:
        raise ValueError(f"'tool_choice' {choice!r} forces a call whose arguments follow the tool's parameters, "
                         f"but: {e}", "tool_choice")
    c.forced_tool_call = True
    return c


def can_force(fmt: ToolFormat) -> bool:
    return (fmt.start, fmt.end) == JSON_TOOLS and getattr(fmt.parser, "__module__", "").endswith("json_tools")
