"""The pruned draft head (FR-Spec): the subset's logits are the full head's logits
at those ids (untied, tied and quantised heads, through the model's own forward);
the acceptance rule with q over a subset reproduces p exactly (enumeration); the
frequency table is checked against the tokenizer; and on the real SmolLM2 the
default pruned head gives plain decoding's greedy output."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxspec
import tiny_models
from mlxspec.cpu import draft_weights
from mlxspec.drafting import vocab_subset
from mlxspec.errors import MlxspecError
from mlxspec.core.sampling import SamplingParams, process_logits
from mlxspec.drafting.vocab_subset import SubsetHead
from test_acceptance_exact import V, exact_output, random_dist


@pytest.mark.parametrize("arch,tied,quantized", [("llama", False, False), ("qwen2", True, False),
                                                 ("llama", False, True), ("qwen2", True, True)])
def test_subset_logits_are_the_full_heads_rows(arch, tied, quantized, monkeypatch):
    monkeypatch.setenv(draft_weights.ENV, "0")  # the rows as they are (int8 rows: the next test)
    cfg = {**tiny_models.config_for(arch), "tie_word_embeddings": tied}
    model = tiny_models.build(cfg, seed=4, scale=2.0)
    if quantized:
        nn.quantize(model, group_size=32, bits=8)
    ids = [3, 7, 8, 100, 250, 299]
    x = mx.array([[5, 17, 42, 9]])
    full = model(x)[0]
    head = SubsetHead(model, ids, cfg["vocab_size"])
    sub = head.model(x)[0]
    assert sub.shape == (4, len(ids))
    np.testing.assert_allclose(np.array(sub), np.array(full[:, ids]), rtol=1e-5, atol=1e-5)
    scattered = np.array(head.scatter(sub))
    assert np.isneginf(np.delete(scattered, ids, axis=1)).all()
    # the model itself is untouched
    np.testing.assert_allclose(np.array(model(x)[0]), np.array(full), atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_the_rows_are_int8_where_the_drafts_weights_are(tied, monkeypatch):
    """A pruned head is a draft's: where cpu/draft_weights.py rounds the draft to int8, its
    rows are rounded the same way (a 16-bit head would be a quarter of a draft step's
    bytes); with MLXSPEC_DRAFT_INT8=0 they stay exact."""
    if not draft_weights.wanted():
        pytest.skip("no int8 draft kernel here")
    cfg = {**tiny_models.config_for("qwen2"), "tie_word_embeddings": tied}
    model = tiny_models.build(cfg, seed=4, scale=2.0)
    ids = list(range(0, 300, 3))
    x = mx.array([[5, 17, 42, 9]])
    full = np.array(model(x)[0])[:, ids]
    head = SubsetHead(model, ids, cfg["vocab_size"])
    assert head.fmt == "i8"
    sub = np.array(head.model(x)[0])
    assert not np.array_equal(sub, full)  # rounded ...
    np.testing.assert_allclose(sub, full, atol=0.05 * np.abs(full).max())  # ... to int8
    monkeypatch.setenv(draft_weights.ENV, "0")
    exact = SubsetHead(model, ids[:-1], cfg["vocab_size"])  # other ids: not the shared rows above
    assert exact.fmt != "i8"
    np.testing.assert_allclose(np.array(exact.model(x)[0]), full[:, :-1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(20))
def test_acceptance_with_a_pruned_q_reproduces_p_exactly(seed):
    """q is the draft's distribution renormalised over a random subset (zero
    elsewhere), including subsets that miss the target's most likely token."""
    rng = np.random.default_rng(seed)
    p = random_dist(rng, zeros=seed % 2)
    full_q = random_dist(rng)
    subset = rng.choice(V, size=2 + seed % 4, replace=False)
    if seed % 5 == 0:
        subset = np.array([t for t in range(V) if t != int(np.argmax(p))])
    q = np.zeros(V)
    q[subset] = full_q[subset] / full_q[subset].sum()
    np.testing.assert_allclose(exact_output(p, q), p, atol=1e-6)


def test_the_unnormalised_restriction_is_not_exact():
    """The control: reporting q restricted to the subset without renormalising
    it (the draft still samples from the renormalised one) breaks exactness."""
    rng = np.random.default_rng(3)
    p, full_q = random_dist(rng), random_dist(rng)
    subset = np.array([0, 2, 4])
    q = np.zeros(V)
    q[subset] = full_q[subset] / full_q[subset].sum()
    from test_acceptance_exact import acceptance_probability, residual

    qm_true, qm_wrong = mx.array(q[None].repeat(V, 0)), mx.array((q * full_q[subset].sum())[None].repeat(V, 0))
    pm, xs = mx.array(p[None].repeat(V, 0)), mx.arange(V)
    a = np.array(acceptance_probability(pm, qm_wrong, xs))
    r = np.array(residual(pm, qm_wrong, xs))
    out = q * a + ((q * (1 - a))[:, None] * r).sum(0)  # tokens drawn from the true q
    assert np.abs(out - p).max() > 1e-2
    assert np.abs(exact_output(p, np.array(qm_true[0])) - p).max() < 1e-6


class WordTokenizer:
    """The smallest tokenizer interface the table needs."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[w] for w in text.split() if w in self.vocab]


def test_frequency_table_counts_the_corpus_and_refuses_another_tokenizer(tmp_path):
    tok = WordTokenizer(["<unk>", "def", "return", "self", "import", "zzz-never"])
    files = vocab_subset.corpus_files(limit=300_000)
    assert files and all(f.suffix == ".py" or f.name == "METADATA" for f in files)
    assert any(f.name == "METADATA" for f in files)  # prose and fenced code, besides the stdlib sources
    counts = vocab_subset.count_tokens(tok, files)
    assert counts[tok.vocab["def"]] > 0 and counts[tok.vocab["zzz-never"]] == 0
    table = vocab_subset._table(tok, counts, "test")
    path = tmp_path / vocab_subset.FILE_NAME
    vocab_subset.write_table(table, path)
    ranked = vocab_subset.ranked_tokens(tok, tmp_path)
    assert ranked[:1] != [tok.vocab["zzz-never"]] and set(ranked) <= set(range(6))
    # always-tokens, then half from the corpus ranking, the rest by lowest id
    big = list(range(100, 110))
    assert vocab_subset.choose_ids(big, 7, always=[50], vocab_size=200) == [0, 1, 2, 50, 100, 101, 102]
    assert vocab_subset.choose_ids(ranked, 6, vocab_size=6) == list(range(6))
    other = WordTokenizer(["<unk>", "def", "return", "self", "import", "zzz-never", "extra"])
    with pytest.raises(MlxspecError) as e:
        vocab_subset.ranked_tokens(other, tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "6 tokens" in msg and "7 tokens" in msg and str(path) in msg
    renamed = WordTokenizer(["<unk>", "def", "return", "self", "import", "zzz-other"])  # same size, other text
    with pytest.raises(MlxspecError, match="another tokenizer"):
        vocab_subset.ranked_tokens(renamed, tmp_path)
    path.write_text(json.dumps({**table, "ranked": [1, 99]}))
    with pytest.raises(MlxspecError, match="outside"):
        vocab_subset.ranked_tokens(tok, tmp_path)
    path.write_text("{not json")
    with pytest.raises(MlxspecError, match="unreadable"):
        vocab_subset.ranked_tokens(tok, tmp_path)


@pytest.mark.real
def test_smollm2_with_the_default_pruned_head_equals_plain_greedy(smollm2_pair):
    pair = smollm2_pair
    prompt = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    plain = mlxspec.generate(pair, prompt, max_tokens=24, drafter="none")
    for vocab in (16384, 4096):  # a third of the 49152-token vocabulary, and a small subset that misses more
        res = mlxspec.generate(pair, prompt, max_tokens=24, num_draft=4, draft_vocab=vocab)
        assert res.tokens == plain.tokens
        assert res.stats.draft_accepted > 0  # (24 tokens: 19 of 19 drafts kept, and 18 of 24 with 4096)
    d = mlxspec.api.make_drafter(pair, "model", draft_vocab=16384)
    assert d.subset is not None and d.subset.size == 16384
    assert mlxspec.api.make_drafter(pair, "model", draft_vocab="full").subset is None
    assert vocab_subset.DEFAULT_SIZE > 49152  # so by default SmolLM2's whole vocabulary is scored
    assert mlxspec.api.make_drafter(pair, "model").subset is None


@pytest.mark.real
def test_smollm2_pruned_head_sampling_matches_its_own_q(smollm2_pair, monkeypatch):
    """The q a pruned drafter reports is exactly the subset-renormalised
    distribution of the full model (what its tokens are drawn from)."""
    pair = smollm2_pair
    monkeypatch.setenv(draft_weights.ENV, "0")  # the head's rows as they are, so the full head is the reference
    d = mlxspec.api.make_drafter(pair, "model", draft_vocab=4096)
    params = SamplingParams(temp=0.8, top_k=50)
    history = pair.tokenizer.encode("def add(a, b):\n    return")
    prop = d.propose(history, 3, params, mx.random.key(0))
    assert len(prop) == 3
    ids = np.array(d.subset.ids)
    for i in range(3):
        logits = pair.draft(mx.array(history + prop.tokens[:i])[None])[0, -1:]
        masked = np.full(logits.shape, -np.inf, dtype=np.float32)
        masked[:, ids] = np.array(logits)[:, ids]
        want = np.exp(np.array(process_logits(mx.array(masked), params)))
        np.testing.assert_allclose(np.array(prop.q[i:i + 1]), want, atol=1e-5)
        assert prop.tokens[i] in set(ids.tolist())


def test_the_conversations_tokens_join_the_subset():
    """Names in the prompt come back in the answer: prefill widens the subset by the
    history's tokens, so they can be drafted (and q stays over the subset in use)."""
    from mlxspec.drafting.drafters import ModelDrafter

    cfg = tiny_models.config_for("llama")
    model = tiny_models.build(cfg, seed=4, scale=2.0)
    d = ModelDrafter(model, subset=SubsetHead(model, [0, 1, 2, 3], cfg["vocab_size"]))
    history = [9, 250, 3, 9]
    d.prefill(history)
    assert set(np.array(d.subset.ids).tolist()) == {0, 1, 2, 3, 9, 250}
    prop = d.propose(history, 2, SamplingParams(temp=1.0), mx.random.key(1))
    assert set(prop.tokens) <= {0, 1, 2, 3, 9, 250}
    q = np.array(prop.q)
    assert np.allclose(q.sum(axis=-1), 1, atol=1e-5) and np.all(np.delete(q, [0, 1, 2, 3, 9, 250], axis=1) == 0)
