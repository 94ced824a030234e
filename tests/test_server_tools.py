"""Tool calls in `mlxspec serve` (issue 61; server/tools.py), in process on a tiny model
whose chat template takes tools the way Qwen2.5's does: the request's tools reach the
template, earlier tool calls and tool results render through it, a reply's
<tool_call>{json}</tool_call> becomes OpenAI's `tool_calls` with finish_reason
"tool_calls" (whole and streamed, whatever the piece boundaries), text around a call
stays content, `parallel_tool_calls: false` keeps the first call, a model without a
tool-call format is a 400 naming `tools`, and `tool_choice` "required" or a named
function makes even a random model's reply one well-formed call to it, the same
speculative as plain."""

import json

import pytest

import mlxspec
import tiny_models
from mlxspec.server.requests import RequestError, encode, parse_request
from mlxspec.server.responses import Shapes
from mlxspec.server.tools import ToolStream

QWEN_LIKE = """{%- if tools %}<|im_start|>system
# Tools
<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>
Call a function as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_pair(tiny_pair_dirs, tmp_path_factory):
    target, draft = tiny_pair_dirs
    root = tmp_path_factory.mktemp("tools")
    return mlxspec.load(tiny_models.copy_with_chat_template(target, root / "target", QWEN_LIKE),
                        tiny_models.copy_with_chat_template(draft, root / "draft", QWEN_LIKE))


def chat(**body):
    return parse_request("chat", {"messages": [{"role": "user", "content": "Weather in Paris?"}], **body})


def test_tools_reach_the_template_and_tool_turns_render(tool_pair):
    tok = tool_pair.tokenizer
    with_tools = tok.decode(encode(tool_pair, req := chat(tools=[WEATHER])))
    assert req.tool_format is not None and req.tool_format.start == "<tool_call>"
    assert "get_weather" in with_tools and "The weather in a city" in with_tools
    assert "get_weather" not in tok.decode(encode(tool_pair, chat(tools=[WEATHER], tool_choice="none")))
    turns = parse_request("chat", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]})
    text = tok.decode(encode(tool_pair, turns))
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text  # arguments as an object
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text


def test_a_model_without_a_tool_format_is_a_400(tiny_pair):
    with pytest.raises(RequestError) as e:
        encode(tiny_pair, chat(tools=[WEATHER]))
    assert e.value.param == "tools" and "'tools' is not supported" in e.value.message
    with pytest.raises(RequestError) as e:  # a forced call on a model without the format: the same 400
        encode(tiny_pair, chat(tools=[WEATHER], tool_choice="required"))
    assert e.value.param == "tools"
    for bad in ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, {"tool_choice": "sometimes"},
                {"tool_choice": "required", "response_format": {"type": "json_object"}}):
        with pytest.raises(RequestError) as e:
            chat(tools=[WEATHER], **bad)
        assert e.value.param in ("tool_choice", "response_format")
    with pytest.raises(RequestError) as e:  # arguments outside the schema subset: named
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "integer", "minimum": 1}}}],
             tool_choice="required")
    assert e.value.param == "tool_choice" and "'minimum'" in e.value.message
    with pytest.raises(RequestError) as e:
        chat(tools=[{"type": "function"}])
    assert e.value.param == "tools[0]"


class Stats:
    prompt_tokens = prompt_tokens_processed = generated_tokens = draft_proposed = draft_accepted = 1
    target_passes = tokens_speculative = tokens_plain = 1
    acceptance_rate = tokens_per_pass = generation_tps = 1.0
    drafter, notes = "draft-model", []


def reply(tool_pair, text, **body):
    req = chat(tools=[WEATHER], **body)
    encode(tool_pair, req)
    shapes = Shapes("chat", "m", req, tool_pair.tokenizer)
    shapes.add(("text", text, False))
    return shapes.full(None, "stop", Stats(), 3)["choices"][0], req


def test_tool_calls_are_parsed_from_the_reply(tool_pair):
    choice, _ = reply(tool_pair, "Let me look.\n" + CALL)
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Let me look."
    [call] = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    two, _ = reply(tool_pair, CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert [json.loads(c["function"]["arguments"])["city"] for c in two["message"]["tool_calls"]] == ["Paris", "Oslo"]
    one, _ = reply(tool_pair, CALL + "\n" + CALL.replace("Paris", "Oslo"), parallel_tool_calls=False)
    assert len(one["message"]["tool_calls"]) == 1
    plain, _ = reply(tool_pair, "It is sunny. <tool_ca")  # no call: all content, a plain stop
    assert plain == {**plain, "finish_reason": "stop", "message": {"role": "assistant", "content": "It is sunny. <tool_ca"}}
    cut, _ = reply(tool_pair, '<tool_call>\n{"name": "get_weather", "argu')  # cut off by max_tokens: no call
    assert "tool_calls" not in cut["message"] and cut["finish_reason"] == "stop"


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_tool_calls_whatever_the_pieces(tool_pair, size):
    text = "Sure." + CALL
    req = chat(tools=[WEATHER])
    encode(tool_pair, req)
    shapes = Shapes("chat", "m", req, tool_pair.tokenizer)
    chunks = [c for i in range(0, len(text), size) for c in shapes.stream_text(("text", text[i:i + size], False))]
    chunks += shapes.stream_end("stop")
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert content == "Sure."
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    held = ToolStream(req.tool_format, req.tools)
    assert held.feed("a <tool") == "a " and held.feed("box>") == "<toolbox>"  # a false start is released


FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": {
    "type": "object", "required": ["unit", "days"],
    "properties": {"unit": {"enum": ["C", "F"]}, "days": {"type": "integer"}}}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "forecast"}}],
                         ids=["required", "named"])
def test_a_forced_call_is_one_valid_call(tool_pair, choice):
    from mlxspec.api import GenerationStream, make_decoder
    from mlxspec.server.requests import sampling_params
    from mlxspec.server.tools import split_tool_calls
    from mlxspec.core.sampling import SamplingParams

    texts = []
    for k in (0, 3):
        req = chat(tools=[FORECAST, WEATHER] if choice != "required" else [FORECAST], tool_choice=choice)
        params = sampling_params(SamplingParams(), req)
        history = encode(tool_pair, req)
        stream = GenerationStream(make_decoder(tool_pair, num_draft=k), tool_pair.tokenizer, history, params, 200,
                                  eos_token_ids=tool_pair.eos_token_ids)
        for _ in stream:
            pass
        assert stream.stats.finish_reason == "stop" and (k == 0 or stream.stats.draft_accepted > 0)
        texts.append(stream.text)
    assert texts[0] == texts[1]  # speculative = plain under the forced call
    content, calls = split_tool_calls(texts[0], req.tool_format, req.tools)
    assert content.strip() == "" and len(calls) == 1 and calls[0]["function"]["name"] == "forecast", texts[0]
    args = json.loads(calls[0]["function"]["arguments"])
    assert args["unit"] in ("C", "F") and type(args["days"]) is int
