"""Constrained decoding: replies that must be JSON (OpenAI's `response_format`).

`vocab.py` gives every token id its bytes (byte-level BPE and SentencePiece alike);
`json_machine.py` is a byte-level incremental recogniser of JSON, optionally held
to a JSON schema (a documented subset); `mask.py` walks a trie of the vocabulary's
token bytes with the recogniser to find, for a generated prefix, the tokens that
keep the reply valid, as an additive (V,) mask of 0 and -inf.  The mask is one more
context-dependent step of core/sampling.process_logits (the `constraint` of a
SamplingParams), applied to the target's p and the draft's q alike, so speculative
decoding stays exact: the output is the constrained target's.
"""
