"""JSON replies (issue 61; mlxspec/constrained/): the recogniser accepts what json.dumps
writes and refuses near misses, schemas outside the subset are refused by keyword, the
token mask allows exactly the tokens whose bytes keep the reply valid (checked against
every token on a tiny vocabulary), and under the constraint speculative decoding is
still the plain run's (greedy and coupled, chains and trees, the draft's q masked as p)
while its replies are schema-valid JSON (the unconstrained reply is not: the constraint
has power)."""

import json
import random

import numpy as np
import pytest

import mlxspec
from mlxspec.api import GenerationStream, encode_prompt, make_decoder
from mlxspec.constrained.json_machine import Machine, SchemaError
from mlxspec.constrained.mask import JsonConstraint
from mlxspec.constrained.vocab import vocab_bytes
from mlxspec.core.sampling import SamplingParams

SCHEMA = {"type": "object", "required": ["ok", "size", "tags"], "properties": {
    "ok": {"type": "boolean"}, "size": {"enum": ["small", "large", 3]}, "note": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"type": "integer"}}}}


BOUNDED = {"type": "object", "required": ["ok", "size", "n"], "properties": {  # a reply of bounded length
    "ok": {"type": "boolean"}, "size": {"enum": ["small", "large", 3]}, "n": {"type": "integer"}}}


def test_the_recogniser_accepts_json_and_refuses_near_misses():
    rng = random.Random(0)

    def value(d=0):
        kinds = ["int", "float", "lit", "str"] + (["list", "dict"] if d < 3 else [])
        k = rng.choice(kinds)
        return {"int": lambda: rng.randrange(-10**6, 10**6), "float": lambda: rng.random() * 10 ** rng.randrange(-7, 7),
                "lit": lambda: rng.choice([True, False, None]),
                "str": lambda: "".join(rng.choice('ab"\\\n\té€ ') for _ in range(rng.randrange(6))),
                "list": lambda: [value(d + 1) for _ in range(rng.randrange(3))],
                "dict": lambda: {f"k{i}": value(d + 1) for i in range(rng.randrange(3))}}[k]()

    free = Machine()
    for _ in range(200):
        text = json.dumps({"v": value()}, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
        assert free.accepts(text.encode()), text
    for bad in ('{"a": 01}', '[1]', '{"a": 1,}', '{"a" 1}', '{"a": "x', '{"a": tru}', '{"a": 1}}', '{"a": "\x01"}'):
        assert not free.accepts(bad.encode()), bad
    m = Machine(SCHEMA)
    assert m.accepts(b'{"tags": [1, -2], "size": 3, "ok": true, "note": null}')
    for bad in ('{"ok": true, "size": 3}', '{"ok": true, "size": 4, "tags": []}', '{"ok": 1, "size": 3, "tags": []}',
                '{"ok": true, "size": "small", "tags": [1.5]}', '{"ok": true, "size": 3, "tags": [], "x": 1}',
                '{"ok": true, "ok": true, "size": 3, "tags": []}'):
        assert not m.accepts(bad.encode()), bad
    for schema, keyword in (({"type": "string", "pattern": "a+"}, "pattern"), ({"anyOf": []}, "anyOf"),
                            ({"type": "object", "properties": {"a": {"$ref": "#"}}}, "$ref"), ({"type": "date"}, "type")):
        with pytest.raises(SchemaError) as e:
            Machine(schema)
        assert e.value.keyword == keyword and keyword in str(e.value)


@pytest.mark.parametrize("schema,text", [
    (SCHEMA, '{"ok": false, "tags": [12, 3], "size": "large", "note": "a \\"b\\""}'),
    (None, ' {"any": [1.5e3, {"k": null}], "b": "\\u00e9t\\u00e9"}')], ids=["json_schema", "json_object"])
def test_the_mask_is_exactly_the_tokens_that_keep_the_reply_valid(tiny_pair, schema, text):
    tok = tiny_pair.tokenizer
    table = vocab_bytes(tok)
    c = JsonConstraint(schema).bind(tok, tiny_pair.eos_token_ids)
    m = c.machine
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(table[i] for i in ids).decode() == text
    for n in range(len(ids) + 1):
        row = np.array(c.mask([ids[:n]], len(table) + 3))[0]
        st = c.state(ids[:n])
        for t, data in enumerate(table):
            s = st
            for b in data or b"":
                s = s if s is None else m.step(s, b)
            want = (s is not None and data is not None) or (t in tiny_pair.eos_token_ids and m.can_end(st))
            assert (row[t] == 0) == want, (n, t, data)
        assert np.all(row[len(table):] == -np.inf)  # rows past the tokenizer: never
    assert m.can_end(c.state(ids))


def generate(pair, params, num_draft, tree=None, tokens=200):
    dec = make_decoder(pair, num_draft=num_draft, tree=tree)
    history = encode_prompt(pair.tokenizer, "Say it in JSON:", chat_template=False)
    stream = GenerationStream(dec, pair.tokenizer, history, params, tokens, eos_token_ids=pair.eos_token_ids)
    for _ in stream:
        pass
    return stream


@pytest.mark.parametrize("sampling", [dict(), dict(temp=0.8, seed=4)], ids=["greedy", "coupled"])
def test_speculative_equals_plain_under_the_constraint(tiny_pair, sampling):
    def params():
        return SamplingParams(**sampling, constraint=JsonConstraint(BOUNDED).bind(tiny_pair.tokenizer,
                                                                                 tiny_pair.eos_token_ids))

    plain = generate(tiny_pair, params(), 0)
    reply = json.loads(plain.text)
    assert plain.stats.finish_reason == "stop" and set(reply) == {"ok", "size", "n"}, plain.text
    assert isinstance(reply["ok"], bool) and reply["size"] in ("small", "large", 3) and type(reply["n"]) is int
    free = generate(tiny_pair, SamplingParams(**sampling), 0)
    assert not Machine(BOUNDED).accepts(free.text.encode())  # without it the tiny model writes no such JSON
    accepted = 0
    for k, tree in ((3, False), (6, False), (None, None)):
        s = generate(tiny_pair, params(), k, tree)
        assert s.tokens == plain.tokens, (k, tree)
        accepted += s.stats.draft_accepted
    assert accepted > 0
    print(repr(plain.text), "accepted:", accepted)
