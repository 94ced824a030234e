"""A byte-level incremental recogniser of JSON, optionally held to a JSON schema.

`Machine(schema)`: schema None is OpenAI's `json_object` (any JSON object); otherwise a
JSON schema in this subset (anything else is a `SchemaError` naming the keyword):

    type            "object" | "array" | "string" | "number" | "integer" | "boolean" | "null",
                    or a list of them
    properties      the object's keys, each with its schema; only these keys are written,
                    at most once each, in any order (as OpenAI's strict mode: extra keys never)
    required        keys that must be written before the object closes
    additionalProperties  false or true (either way only `properties` are written;
                    an object schema without `properties` takes any keys)
    items           the schema of every array element
    enum, const     the value is one of these, written as json.dumps writes it
    title, description, default, examples, $schema   annotations, ignored

States are hashable tuples, so the token masks built from them can be cached:
`step(state, byte)` is the next state or None (the byte breaks the JSON);
`can_end(state)` says whether the reply may end here.  Literal `prefix` and `suffix`
bytes may wrap the value (a forced tool call: `<tool_call>\n{...}\n</tool_call>`).  Whitespace between tokens is
allowed up to MAX_WS bytes in a row, numbers up to MAX_NUMBER characters, free JSON
nests up to MAX_DEPTH deep, so a reply cannot run on inside them forever.
"""

from __future__ import annotations

import json

from ..errors import MlxspecError

MAX_WS = 16
MAX_NUMBER = 24
MAX_DEPTH = 16
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$comment"}
KNOWN = {"type", "properties", "required", "additionalProperties", "items", "enum", "const"} | ANNOTATIONS
WS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")


class SchemaError(MlxspecError):
    def __init__(self, message: str, keyword: str):
        super().__init__(message)
        self.keyword = keyword


class Node:
    """One compiled schema: the types it takes, an object's keys, an array's items, literals."""

    def __init__(self, types, props=None, required=(), items=None, literals=None, free_keys=False):
        self.types = frozenset(types)
        self.props = props or {}  # key -> node index
        self.required = frozenset(required)
        self.items = items  # node index
        self.literals = literals  # tuple of bytes, or None
        self.free_keys = free_keys  # any key, each value `items`-like: ANY


class Machine:
    def __init__(self, schema: dict | None = None, prefix: bytes = b"", suffix: bytes = b""):
        """`prefix`, `suffix`: literal bytes around the value (a tool call's markers)."""
        self.prefix, self.suffix = prefix, suffix
        self.nodes: list[Node] = []
        any_node = self._add(Node(TYPES))  # index 0: any JSON value (free objects and arrays hold ANY)
        self.nodes[any_node].free_keys = True
        self.nodes[any_node].items = any_node
        if schema is None:
            self.root = self._add(Node(("object",), free_keys=True, items=any_node))
        else:
            self.root = self._compile(schema, "schema", 0)

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _compile(self, s, where: str, depth: int) -> int:
        if not isinstance(s, dict):
            raise SchemaError(f"{where} must be an object (a JSON schema)", where)
        if depth > MAX_DEPTH:
            raise SchemaError(f"{where} nests deeper than {MAX_DEPTH}", where)
        for k in s:
            if k not in KNOWN:
                raise SchemaError(f"the JSON schema keyword {k!r} (at {where}) is not supported by mlxspec serve; "
                                  f"supported: {', '.join(sorted(KNOWN - ANNOTATIONS))}", k)
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else s["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{where}.enum must be a non-empty array", "enum")
            lits = tuple(dict.fromkeys(json.dumps(v, ensure_ascii=False).encode("utf-8") for v in values))
            return self._add(Node((), literals=lits))
        t = s.get("type", list(TYPES))
        types = [t] if isinstance(t, str) else t
        if not isinstance(types, list) or not types or any(x not in TYPES for x in types):
            raise SchemaError(f"{where}.type must be one of {', '.join(TYPES)} or a list of them, got {t!r}", "type")
        node = Node(types)
        idx = self._add(node)
        if "object" in types:
            props = s.get("properties")
            if props is None:
                node.free_keys = True
                node.items = 0
            else:
                if not isinstance(props, dict):
                    raise SchemaError(f"{where}.properties must be an object", "properties")
                node.props = {k: self._compile(v, f"{where}.properties.{k}", depth + 1) for k, v in props.items()}
            req = s.get("required", [])
            if not isinstance(req, list) or any(r not in node.props for r in req):
                raise SchemaError(f"{where}.required must list keys of its properties", "required")
            node.required = frozenset(req)
            if s.get("additionalProperties") not in (None, True, False):
                raise SchemaError(f"{where}.additionalProperties must be true or false (schemas there are not "
                                  "supported)", "additionalProperties")
        if "array" in types:
            node.items = self._compile(s["items"], f"{where}.items", depth + 1) if "items" in s else 0
        return idx

    # -- states: (mode, a, b, stack, ws); stack frames ("o", node, seen keys) / ("a", node, count) --
    def start(self):
        return ("pre", 0, None, (), 0) if self.prefix else ("val", self.root, None, (), 0)

    def _pre(self, st, c):
        if self.prefix[st[1]] != c:
            return None
        return ("pre", st[1] + 1, None, (), 0) if st[1] + 1 < len(self.prefix) else ("val", self.root, None, (), 0)

    def _post(self, st, c):
        if self.suffix[st[1]] != c:
            return None
        return ("post", st[1] + 1, None, (), 0) if st[1] + 1 < len(self.suffix) else ("end", None, None, (), 0)

    def can_end(self, st) -> bool:
        if st[0] == "end":
            return True
        return not st[3] and not self.suffix and self._complete(st)

    def _complete(self, st) -> bool:
        """A number or literal that may stop here (the next byte then belongs to the parent)."""
        mode, a, b = st[0], st[1], st[2]
        if mode == "num":
            return b[0] in ("zero", "int", "frac", "expd")
        if mode == "lit":
            return b[1] == "val" and any(len(c) == b[0] for c in a)
        return False

    def step(self, st, c: int):
        mode = st[0]
        nxt = getattr(self, "_" + mode)(st, c)
        if nxt is None and mode in ("num", "lit") and self._complete(st):
            return self.step(self._done(st[3]), c)
        return nxt

    def _ws(self, st, c):
        if c in WS and st[4] < MAX_WS:
            return st[:4] + (st[4] + 1,)
        return None

    def _done(self, stack):
        """A value just ended: the state of its parent."""
        if not stack:
            return ("post", 0, None, (), 0) if self.suffix else ("end", None, None, (), 0)
        top = stack[-1]
        if top[0] == "o":
            return ("onext", None, None, stack, 0)
        return ("anext", None, None, stack[:-1] + (("a", top[1], top[2] + 1),), 0)

    def _val(self, st, c):
        if c in WS:
            return self._ws(st, c)
        node, stack = self.nodes[st[1]], st[3]
        if node.literals is not None:
            cands = tuple(x for x in node.literals if x[:1] == bytes([c]))
            return ("lit", cands, (1, "val"), stack, 0) if cands else None
        t = node.types
        if c == ord("{") and "object" in t and len(stack) < MAX_DEPTH:
            return ("ofirst", None, None, stack + (("o", st[1], frozenset()),), 0)
        if c == ord("[") and "array" in t and len(stack) < MAX_DEPTH:
            return ("afirst", None, None, stack + (("a", st[1], 0),), 0)
        if c == ord('"') and "string" in t:
            return ("str", 0, "val", stack, 0)
        if ("number" in t or "integer" in t) and (c in DIGITS or c == ord("-")):
            kind = "num" if "number" in t else "int_only"
            ns = "sign" if c == ord("-") else ("zero" if c == ord("0") else "int")
            return ("num", kind, (ns, 1), stack, 0)
        lits = [w for ty, w in (("boolean", b"true"), ("boolean", b"false"), ("null", b"null")) if ty in t]
        cands = tuple(w for w in lits if w[0] == c)
        return ("lit", cands, (1, "val"), stack, 0) if cands else None

    def _lit(self, st, c):
        cands, (pos, kind), stack = st[1], st[2], st[3]
        keep = tuple(x for x in cands if len(x) > pos and x[pos] == c)
        if not keep:
            return None
        done = [x for x in keep if len(x) == pos + 1]
        if kind == "key" and done:  # keys are matched with their closing quote: none is another's prefix
            top = stack[-1]
            key = json.loads(b'"' + done[0])
            return ("colon", key, None, stack[:-1] + (("o", top[1], top[2] | {key}),), 0)
        if kind == "val" and done and len(keep) == 1:  # nothing longer can follow: the value ends here
            return self._done(stack)
        return ("lit", keep, (pos + 1, kind), stack, 0)

    def _str(self, st, c):
        esc, kind, stack = st[1], st[2], st[3]
        if esc == 0:
            if c == ord('"'):
                return ("colon", None, None, stack, 0) if kind == "key" else self._done(stack)
            if c == ord("\\"):
                return ("str", 1, kind, stack, 0)
            return None if c < 0x20 else st
        if esc == 1:
            if c in b'"\\/bfnrt':
                return ("str", 0, kind, stack, 0)
            return ("str", 5, kind, stack, 0) if c == ord("u") else None
        if c in b"0123456789abcdefABCDEF":  # esc 5..2: \u hex digits left + 1
            return ("str", 0 if esc == 2 else esc - 1, kind, stack, 0)
        return None

    def _num(self, st, c):
        kind, (ns, n), stack = st[1], st[2], st[3]
        if n >= MAX_NUMBER:
            return None
        d = c in DIGITS
        frac_ok = kind == "num"
        nxt = None
        if ns == "sign":
            nxt = "zero" if c == ord("0") else ("int" if d else None)
        elif ns in ("zero", "int"):
            if d and ns == "int":
                nxt = "int"
            elif c == ord(".") and frac_ok:
                nxt = "dot"
            elif c in b"eE" and frac_ok:
                nxt = "exp"
        elif ns in ("dot", "frac"):
            nxt = "frac" if d else ("exp" if c in b"eE" and ns == "frac" else None)
        elif ns == "exp":
            nxt = "expsign" if c in b"+-" else ("expd" if d else None)
        elif ns in ("expsign", "expd"):
            nxt = "expd" if d else None
        return None if nxt is None else ("num", kind, (nxt, n + 1), stack, 0)

    def _keys_left(self, frame) -> bool:
        node = self.nodes[frame[1]]
        return node.free_keys or bool(set(node.props) - frame[2])

    def _close_ok(self, frame) -> bool:
        return self.nodes[frame[1]].required <= frame[2]

    def _key(self, st, c):
        frame = st[3][-1]
        node = self.nodes[frame[1]]
        if c != ord('"'):
            return None
        if node.free_keys:
            return ("str", 0, "key", st[3], 0)
        cands = tuple(json.dumps(k, ensure_ascii=False).encode("utf-8")[1:] for k in node.props if k not in frame[2])
        return ("lit", cands, (0, "key"), st[3], 0) if cands else None

    def _ofirst(self, st, c):
        if c in WS:
            return self._ws(st, c)
        frame = st[3][-1]
        if c == ord("}"):
            return self._done(st[3][:-1]) if self._close_ok(frame) else None
        return self._key(st, c)

    def _okey(self, st, c):
        return self._ws(st, c) if c in WS else self._key(st, c)

    def _colon(self, st, c):
        if c in WS:
            return self._ws(st, c)
        if c != ord(":"):
            return None
        frame = st[3][-1]
        node = self.nodes[frame[1]]
        child = 0 if node.free_keys else node.props[st[1]]
        return ("val", child, None, st[3], 0)

    def _onext(self, st, c):
        if c in WS:
            return self._ws(st, c)
        frame = st[3][-1]
        if c == ord(","):
            return ("okey", None, None, st[3], 0) if self._keys_left(frame) else None
        if c == ord("}"):
            return self._done(st[3][:-1]) if self._close_ok(frame) else None
        return None

    def _afirst(self, st, c):
        if c in WS:
            return self._ws(st, c)
        if c == ord("]"):
            return self._done(st[3][:-1])
        return self._val(("val", self.nodes[st[3][-1][1]].items, None, st[3], 0), c)

    def _anext(self, st, c):
        if c in WS:
            return self._ws(st, c)
        if c == ord(","):
            return ("val", self.nodes[st[3][-1][1]].items, None, st[3], 0)
        if c == ord("]"):
            return self._done(st[3][:-1])
        return None

    def _end(self, st, c):
        return None

    def accepts(self, data: bytes) -> bool:
        """The whole of `data` is a complete reply (tests)."""
        st = self.start()
        for c in data:
            st = self.step(st, c)
            if st is None:
                return False
        return self.can_end(st)
