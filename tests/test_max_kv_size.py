"""`max_kv_size` (mlx-lm's --max-kv-size): with the KV caches bounded to N positions,
greedy speculative output equals mlx-lm's own token-by-token decoding of the same
target with `RotatingKVCache(N, keep=4)` -- for a draft model, prompt lookup and
layer skipping, k in {1, 3, auto}, generations that wrap the window several times
(so rejected drafts are rolled back through checkpoints, not trims) -- while the
caches stay bounded; any grouping of positions into passes gives mlx-lm's
token-by-token logits.  Two controls show the comparison can fail: mlx-lm's own mask
for a multi-position pass, and a rollback that trims a wrapped window instead of
restoring its checkpoint.  Trees fall back to chains with a note; a Session's
second turn after the window wrapped processes only the new message and still
gives mlx-lm's output; bad values are one line."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

import drafter_models
import mlxspec
import tiny_models
from mlxspec.core import recurrent
from mlxspec.costs.cost_model import assumed
from mlxspec.costs.draft_length import FixedK, PerToken
from mlxspec.drafting.drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from mlxspec.core.kv_window import WindowKVCache
from mlxspec.core.options import MIN_KV_SIZE, RULES
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.core.stats import GenerationStats
from mlxspec.trees.round import BOUNDED_CACHE

PROMPT = [5, 17, 33, 80, 91, 120, 7, 9]
TOKENS = 90  # with N = 21..24: the window wraps four or five times
MODELS = {}


def models(arch):
    if arch not in MODELS:
        cfg = tiny_models.config_for(arch)
        target = tiny_models.build(cfg, seed=11, scale=3.0)
        MODELS[arch] = target, tiny_models.perturbed(target, cfg, noise=0.02, seed=5)
    return MODELS[arch]


def mlx_lm_greedy(target, history, n, size, eos=()):
    """mlx-lm's decoding with its RotatingKVCache(size, keep=4) for every full KV cache,
    one position per call (mlx-lm's own code throughout; no mlxspec)."""
    cache = [RotatingKVCache(size, keep=4) if type(c) is KVCache else c for c in make_prompt_cache(target)]
    for t in history[:-1]:
        target(mx.array([[t]]), cache=cache)
    out, y = [], history[-1]
    while len(out) < n:
        y = int(mx.argmax(target(mx.array([[y]]), cache=cache)[0, -1]).item())
        if y in eos:
            break
        out.append(y)
    return out


def policy(k, drafter):
    if k == "auto":  # drafting cheap: rounds run long and stop by confidence
        return PerToken(assumed(0.05), 8, lookup=not drafter.uses_draft_model, model=drafter.uses_draft_model)
    return FixedK(k)


def setup(kind, arch, size):
    """(target, drafter, prompt): a draft model drafts for a random target; lookup and
    layer skip get targets where they find something (drafter_models.py), lookup a
    prompt that quotes the target's continuation (longer than the window)."""
    if kind == "model":
        target, draft = models(arch)
        return target, ModelDrafter(draft, max_kv_size=size), PROMPT
    key = (kind, arch)
    if key not in MODELS:
        MODELS[key] = (drafter_models.lookup_target(arch) if kind == "lookup" else
                       drafter_models.layerskip_target(arch))
    target = MODELS[key]
    if kind == "lookup":
        return target, PromptLookupDrafter(), drafter_models.grounded_prompt(target, PROMPT)
    keep = [i for i in range(len(target.model.layers)) if i != drafter_models.SKIPPED]
    return target, LayerSkipDrafter(target, keep=keep, max_kv_size=size), PROMPT


def speculate(target, drafter, k, size, prompt=PROMPT, tree=None, stats=None):
    dec = SpeculativeDecoder(target, drafter, policy(k, drafter), tree=tree, max_kv_size=size)
    h = list(prompt)
    got = [t for t, _ in dec.generate(h, max_tokens=TOKENS, stats=stats)]
    assert h == list(prompt) + got
    return got, dec


def assert_bounded(state, size):
    for c in state.cache:
        assert isinstance(c, WindowKVCache) and c.max_size == size
        assert c.offset > 3 * size  # wrapped several times ...
        assert c.keys.shape[2] <= size + 16  # ... holding at most N - 1 + one verify pass


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("kind", ["model", "lookup", "layerskip"])
@pytest.mark.parametrize("k", [1, 3, "auto"])
@pytest.mark.parametrize("size", [MIN_KV_SIZE, 24])
def test_greedy_equals_mlx_lm_rotating_cache(arch, kind, k, size):
    target, drafter, prompt = setup(kind, arch, size)
    stats = GenerationStats()
    got, dec = speculate(target, drafter, k, size, prompt=prompt, stats=stats)
    assert got == mlx_lm_greedy(target, prompt, TOKENS, size)
    assert stats.draft_accepted > 0 and stats.draft_proposed > stats.draft_accepted  # kept and rejected drafts
    assert dec.target.refed > 0  # rejections past the wrapped window went back to a checkpoint
    assert_bounded(dec.target, size)
    if kind != "lookup":
        assert_bounded(dec.drafter.state, size)


@pytest.mark.parametrize("seed", range(4))
def test_any_grouping_of_positions_gives_token_by_token_logits(seed):
    """Positions fed in random groups (1 to 17 at a time: plain steps, verify passes, prefill
    chunks, in any order) through WindowKVCache give the logits of mlx-lm's token-by-token
    RotatingKVCache at every position."""
    import numpy as np

    target, _ = models("qwen2")
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(5, 299, 110)]
    ref_cache = [RotatingKVCache(MIN_KV_SIZE, keep=4) for _ in target.layers]
    want = mx.concatenate([target(mx.array([[t]]), cache=ref_cache)[0] for t in tokens])
    cache, got, i = [WindowKVCache(MIN_KV_SIZE) for _ in target.layers], [], 0
    while i < len(tokens):
        n = int(rng.choice([1, 1, 2, 4, 17]))
        got.append(target(mx.array([tokens[i: i + n]]), cache=cache)[0])
        i += n
    # float32 sums in another order (a matmul over n rows is not n matmuls over one): ~1e-5 of the
    # logits' scale, and the BLAS kernel a CPU gets sets the digits; a wrong mask moves logits by ~1
    assert mx.abs(mx.concatenate(got) - want).max().item() < 2e-5 * max(1.0, mx.abs(want).max().item())


def test_mlx_lm_generate_step_with_max_kv_size_is_the_reference():
    """For a model without its own cache list (qwen2), mlx-lm's generate_step(max_kv_size=N)
    is the same decoding as the reference loop above."""
    from mlx_lm.generate import generate_step

    target, _ = models("qwen2")
    steps = generate_step(mx.array(PROMPT), target, max_tokens=TOKENS, max_kv_size=MIN_KV_SIZE)
    assert [int(t) for t, _ in steps] == mlx_lm_greedy(target, PROMPT, TOKENS, MIN_KV_SIZE)


def test_a_long_prompt_prefilled_in_chunks_equals_mlx_lm(monkeypatch):
    """A prompt longer than the window, fed in chunks (a multi-position pass from the start)."""
    from mlxspec.core import cache

    monkeypatch.setattr(cache, "PREFILL_STEP", 7)
    target, draft = models("qwen2")
    prompt = [int(t) for t in mx.random.randint(5, 299, (60,), key=mx.random.key(3)).tolist()]
    got, _ = speculate(target, ModelDrafter(draft, max_kv_size=MIN_KV_SIZE), 3, MIN_KV_SIZE, prompt=prompt)
    assert got == mlx_lm_greedy(target, prompt, TOKENS, MIN_KV_SIZE)


def mismatches(arch="qwen2"):
    target, draft = models(arch)
    out = 0
    for k in (1, 3):
        got, _ = speculate(target, ModelDrafter(draft, max_kv_size=MIN_KV_SIZE), k, MIN_KV_SIZE)
        out += got != mlx_lm_greedy(target, PROMPT, TOKENS, MIN_KV_SIZE)
    return out


def test_control_mlx_lm_mask_for_a_verify_pass_fails_the_comparison(monkeypatch):
    """mlx-lm's RotatingKVCache masks a multi-position pass with a plain sliding window,
    hiding the kept positions from all but its first row: not token-by-token decoding."""
    monkeypatch.setattr(WindowKVCache, "make_mask", RotatingKVCache.make_mask)
    assert mismatches() > 0


def branch(arch="qwen2", size=MIN_KV_SIZE):
    """A decoder reused for a history that leaves the last one far inside the wrapped
    window (an edited turn, another request sharing a prefix): (got, mlx-lm's)."""
    target, draft = models(arch)
    dec = SpeculativeDecoder(target, ModelDrafter(draft, max_kv_size=size), FixedK(3), max_kv_size=size)
    h = list(PROMPT)
    list(dec.generate(h, max_tokens=TOKENS))
    history, before = h[:70] + [42, 43, 44], dec.target.refed
    got = [t for t, _ in dec.generate(list(history), max_tokens=40)]
    return got, mlx_lm_greedy(target, history, 40, size), dec.target.refed - before


def test_a_history_that_branches_inside_the_wrapped_window_goes_back_to_a_checkpoint():
    got, want, refed = branch()
    assert got == want
    assert refed >= 70 - len(PROMPT)  # a wrapped window cannot be trimmed back: re-fed from the prompt's checkpoint


def test_control_trimming_a_wrapped_window_fails_the_comparison(monkeypatch):
    """Trimming a window that has wrapped cannot bring back what it overwrote: the
    checkpoint restore is what makes that rollback exact."""
    monkeypatch.setattr(recurrent, "wrapped", lambda c: False)
    got, want, _ = branch()
    assert got != want


@pytest.mark.parametrize("tree", [None, True])
def test_trees_verify_chains_with_a_note(tree):
    target, draft = models("qwen2")  # a model type token trees support, with a full cache
    drafter = ModelDrafter(draft, max_kv_size=MIN_KV_SIZE)
    stats = GenerationStats()
    got, dec = speculate(target, drafter, "auto", MIN_KV_SIZE, tree=tree, stats=stats)
    assert not dec.trees and dec.tree_note.kind == BOUNDED_CACHE and "KV cache is bounded" in dec.tree_note.text
    assert any("verifying chains" in n and "max_kv_size" in n for n in stats.notes), stats.notes
    assert stats.tree_rounds == 0
    assert got == mlx_lm_greedy(target, PROMPT, TOKENS, MIN_KV_SIZE)
    full = SpeculativeDecoder(target, ModelDrafter(draft), policy("auto", drafter), tree=tree)
    assert full.trees  # the same pair without max_kv_size verifies trees


def test_session_second_turn_after_the_window_wrapped(tiny_pair):
    """The second turn reuses the cached conversation (only the new message, plus what
    the last round's rollback re-feeds) and still gives mlx-lm's output."""
    from mlxspec.session.session import Session

    size, eos, target = MIN_KV_SIZE, set(tiny_pair.eos_token_ids), tiny_pair.target
    s = Session(tiny_pair, max_kv_size=size, max_tokens=60, num_draft=3)
    first = s.send("tell me a long story")
    before = len(s.tokens)
    assert first.tokens == mlx_lm_greedy(target, s.tokens[: before - len(first.tokens)], 60, size, eos)
    assert before > 3 * size and s.decoder.target.cache[0].offset > 3 * size  # the window wrapped
    stream = s.stream("and then?")
    for _ in stream:
        pass
    history = stream.prompt_tokens
    assert history[:before] == s.tokens[:before]
    assert stream.reply.tokens == mlx_lm_greedy(target, history, 60, size, eos)
    new = len(history) - before
    assert new + 1 <= stream.prompt_tokens_processed <= new + 1 + 3, (stream.prompt_tokens_processed, new)
    assert s.decoder.target.cache[0].max_size == size and s._drafting._drafter.state.cache[0].max_size == size


@pytest.mark.parametrize("value", [0, -3, MIN_KV_SIZE - 1, 1.5, "many"])
def test_api_and_session_refuse_a_bad_max_kv_size(tiny_pair, value):
    from mlxspec.session.session import Session

    rule = RULES["max_kv_size"].describe()
    for call in (lambda: mlxspec.generate(tiny_pair, "hi", max_kv_size=value),
                 lambda: mlxspec.api.make_decoder(tiny_pair, max_kv_size=value),
                 lambda: Session(tiny_pair, max_kv_size=value)):
        with pytest.raises(mlxspec.MlxspecError) as e:
            call()
        assert str(e.value) == f"max_kv_size {rule}, got {value!r}"


def test_the_api_passes_max_kv_size_to_both_caches(tiny_pair):
    out = mlxspec.generate(tiny_pair, "tell me a long story", max_tokens=60, num_draft=3, max_kv_size=MIN_KV_SIZE)
    ids = mlxspec.api.encode_prompt(tiny_pair.tokenizer, "tell me a long story")
    assert out.tokens == mlx_lm_greedy(tiny_pair.target, ids, 60, MIN_KV_SIZE, set(tiny_pair.eos_token_ids))
    assert out.stats.draft_accepted > 0
    dec = mlxspec.api.make_decoder(tiny_pair, max_kv_size=32)
    assert dec.target.max_kv_size == 32 and dec.drafter.state.max_kv_size == 32
    assert mlxspec.api.make_decoder(tiny_pair).target.max_kv_size is None


def test_the_context_limit_stays_the_models():
    """max_kv_size bounds memory only: a generation still stops at the model's context."""
    target, draft = models("qwen2")
    dec = SpeculativeDecoder(target, ModelDrafter(draft, max_kv_size=MIN_KV_SIZE), FixedK(3), context_length=48,
                             max_kv_size=MIN_KV_SIZE)
    stats, h = GenerationStats(), list(PROMPT)
    got = [t for t, _ in dec.generate(h, max_tokens=100, stats=stats)]
    assert stats.finish_reason == "context" and len(h) == 48
    assert got == mlx_lm_greedy(target, PROMPT, len(got), MIN_KV_SIZE)


@pytest.mark.real
def test_generate_with_max_kv_size_on_smollm2_equals_mlx_lm():
    """The CLI on a real model (llama: mlx-lm's make_prompt_cache would ignore N; mlxspec
    bounds its attention layers all the same) against mlx-lm's token-by-token decoding."""
    import json

    from mlxspec.models.pinned import fetch as weights
    from test_api_cli import run_cli

    if not weights.is_present("smollm2-135m"):
        pytest.skip("SmolLM2-135M is not in the cache (mlxspec pull smollm2)")
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    size, n = 24, 60  # the 18-token prompt and 60 tokens fill the 24-position window more than three times
    r = run_cli("generate", "--model", "smollm2-135m", "--drafter", "lookup", "--num-draft", "3",
                "--max-kv-size", str(size), "-m", str(n), "--ignore-chat-template", "-p", prompt, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    pair = mlxspec.load("smollm2-135m", no_draft=True)
    ids = mlxspec.api.encode_prompt(pair.tokenizer, prompt, chat_template=False)
    assert doc["tokens"] == mlx_lm_greedy(pair.target, ids, n, size, set(pair.eos_token_ids))
    assert len(ids) + len(doc["tokens"]) > 3 * size and doc["stats"]["draft_accepted"] > 0


def test_serve_with_max_kv_size(tiny_pair_dirs, tiny_pair, tmp_path):
    """`serve --max-kv-size N`: a greedy reply past the window is mlx-lm's bounded decoding."""
    from server_process import ServerProcess

    t, d = tiny_pair_dirs
    server = ServerProcess(tmp_path, "--model", str(t), "--draft", str(d), "--num-draft-tokens", "3",
                           "--max-kv-size", str(MIN_KV_SIZE))
    try:
        messages = [{"role": "user", "content": "tell me a long story"}]
        status, body, _ = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 60,
                                                                "temperature": 0})
        assert status == 200, body
    finally:
        server.stop()
    want = mlxspec.generate(tiny_pair, messages, max_tokens=60, drafter="none", max_kv_size=MIN_KV_SIZE)
    ids = mlxspec.api.encode_prompt(tiny_pair.tokenizer, messages)
    assert want.tokens == mlx_lm_greedy(tiny_pair.target, ids, 60, MIN_KV_SIZE, set(tiny_pair.eos_token_ids))
    assert body["choices"][0]["message"]["content"] == want.text
    assert want.text != mlxspec.generate(tiny_pair, messages, max_tokens=60, drafter="none").text  # the flag matters
    assert body["usage"]["completion_tokens"] == len(want.tokens) and len(ids) + len(want.tokens) > 2 * MIN_KV_SIZE


def test_generate_cli_with_max_kv_size(tiny_pair_dirs, tiny_pair):
    import json

    from test_api_cli import run_cli

    t, d = tiny_pair_dirs
    r = run_cli("generate", "--model", str(t), "--draft", str(d), "--num-draft", "3", "--max-kv-size",
                str(MIN_KV_SIZE), "-m", "60", "-p", "tell me a long story", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ids = mlxspec.api.encode_prompt(tiny_pair.tokenizer, "tell me a long story", chat_template=True)
    assert doc["tokens"] == mlx_lm_greedy(tiny_pair.target, ids, 60, MIN_KV_SIZE, set(tiny_pair.eos_token_ids))
    assert len(ids) + len(doc["tokens"]) > 2 * MIN_KV_SIZE
