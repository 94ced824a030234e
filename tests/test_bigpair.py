"""Opt-in: the default Qwen2.5-Coder 0.5B -> 1.5B pair (run with `./setup.sh test -m bigpair`;
needs `mlxspec pull`, ~1.6 GB, and several minutes on a CPU)."""

import pytest

import mlxspec
from mlxspec.models.tokenizer_compat import check_tokenizers
from mlxspec.models.loading import load_model_dir, resolve_model_dir

pytestmark = pytest.mark.bigpair

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash map is in two sentences.",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
]


@pytest.fixture(scope="module")
def pair():
    return mlxspec.load()


def test_tokenizers_match(pair):
    assert pair.compatibility.ok
    res = check_tokenizers(pair.tokenizer, load_model_dir(resolve_model_dir("qwen2.5-coder-0.5b"), "draft")[1])
    assert res.ok and res.target_vocab == res.draft_vocab
    assert pair.tokenizer.encode("Hello world") == [9707, 1879]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_greedy_equals_plain(pair, prompt):
    plain = mlxspec.generate(pair, prompt, max_tokens=40, drafter="none", chat_template=True)
    spec = mlxspec.generate(pair, prompt, max_tokens=40, num_draft=4, chat_template=True)
    assert spec.tokens == plain.tokens, (plain.text, spec.text)
    assert spec.stats.acceptance_rate > 0.3
