"""`mlxspec serve`: OpenAI's `response_format`, as a constraint on what the target samples.

{"type": "text"} (or none) leaves the reply free.  {"type": "json_object"} makes it a
JSON object, {"type": "json_schema", "json_schema": {"schema": {...}}} a JSON value
that follows the schema, for the subset mlxspec/constrained/json_machine.py documents
(a keyword outside it is a 400 naming the keyword).  The constraint masks the
target's distribution p and the draft's q alike (core/sampling.process_logits), so
speculative decoding stays exact: the reply is the constrained target's, token for
token what plain decoding under the same constraint gives.  A reply cut short by
max_tokens (finish_reason "length") can be unfinished JSON, as with OpenAI.
"""

from __future__ import annotations

import json

from ..util.untrusted import printable


def parse_response_format(body: dict, error):
    """A JsonConstraint (not yet bound to a tokenizer) or None; `error(message, param, code)`
    builds the request's 400."""
    from ..constrained.json_machine import SchemaError
    from ..constrained.mask import JsonConstraint

    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise error("'response_format' must be an object with a 'type' (text, json_object or json_schema)",
                    "response_format", "invalid_type")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonConstraint(None)
    if kind != "json_schema":
        raise error(f"'response_format.type' must be text, json_object or json_schema, got "
                    f"{printable(json.dumps(kind)[:40])}", "response_format.type", "invalid_value")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise error("'response_format.json_schema.schema' is required: a JSON schema object",
                    "response_format.json_schema.schema", "missing_required_parameter")
    try:
        return JsonConstraint(spec["schema"])
    except SchemaError as e:
        raise error(f"'response_format.json_schema.schema': {e}", "response_format.json_schema.schema",
                    "unsupported_parameter")
