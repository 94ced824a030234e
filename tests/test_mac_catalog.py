"""Mac-sized pairs in the catalog (issue 58 part 4): mlx-community 4-bit repos, a 0.5B (Qwen3:
0.6B) draft with 3B/7B/14B/32B targets (Qwen3: 4B/8B/14B/32B), each sized from its parameter
counts at 4 bits; a Hub target in the HF cache given without a draft gets its partner."""

import pytest
from click.testing import CliRunner

from mlxspec.converters import catalog
from mlxspec.converters.cli import pairs as pairs_cmd
from mlxspec.errors import MlxspecError
from mlxspec.models import loading, memory

DRAFTS = {
    "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit": ["Qwen2.5-Coder-" + s + "-Instruct-4bit" for s in ("3B", "7B", "14B", "32B")],
    "mlx-community/Qwen2.5-0.5B-Instruct-4bit": ["Qwen2.5-" + s + "-Instruct-4bit" for s in ("3B", "7B", "14B", "32B")],
    "mlx-community/Qwen3-0.6B-4bit": ["Qwen3-" + s + "-4bit" for s in ("4B", "8B", "14B", "32B")],
}


def test_the_catalog_lists_mac_sized_4bit_pairs_of_one_family():
    for draft, targets in DRAFTS.items():
        for t in targets:
            assert ("mlx-community/" + t, draft) in catalog.PAIRS
    assert len(catalog.MAC_PAIRS) == 12
    for t, d in catalog.MAC_PAIRS:
        assert catalog.prequantized(t) == catalog.prequantized(d) == 4
        assert catalog.MODELS[t][0] > catalog.MODELS[d][0]
        assert catalog.MODELS[t][1]["model_type"] == catalog.MODELS[d][1]["model_type"]


@pytest.mark.parametrize("target, draft", catalog.MAC_PAIRS)
def test_their_memory_need_is_the_4bit_size_of_their_parameters(target, draft):
    e = catalog.estimate(target, draft, 4096, 64 << 30, "test")
    (tp, tc), (dp, dc) = catalog.MODELS[target], catalog.MODELS[draft]
    weights = [b for label, b in e.q4.rows if "weights" in label]
    assert weights == [memory.model_bytes(memory.estimate_from_config(c), 4, 2) for c in (tc, dc)]
    assert e.params == (tp, dp) and weights[0] < tp * 0.6  # about 4.5 bits a parameter
    cpu = [b for label, b in e.f32.rows if "weights" in label]
    assert cpu == [memory.model_bytes(memory.estimate_from_config(c), 4, 4) for c in (tc, dc)]  # 4-bit on the CPU too


def test_pairs_command_shows_them():
    res = CliRunner().invoke(pairs_cmd, ["--budget", "16"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("mlx-community/Qwen2.5-Coder-7B-Instruct-4bit "))
    cols = line.split()
    assert cols[1] == "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit" and cols[5] == "yes"


def _cache(monkeypatch, present):
    def fake(repo):
        if repo not in present:
            raise MlxspecError(f"{repo} is not in the Hugging Face cache")
        return repo

    monkeypatch.setattr(loading, "_from_hf_cache", fake)


def test_a_cached_hub_target_brings_its_cached_partner(monkeypatch):
    t, d = "mlx-community/Qwen3-8B-4bit", "mlx-community/Qwen3-0.6B-4bit"
    _cache(monkeypatch, {t, d})
    assert loading.default_draft(t) == (d, loading.PARTNER_NOTE)


def test_a_hub_target_whose_partner_is_not_cached_is_told_it_in_one_line(monkeypatch):
    t, d = "mlx-community/Qwen2.5-Coder-14B-Instruct-4bit", "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit"
    _cache(monkeypatch, {t})
    draft, note = loading.default_draft(t)
    assert draft is None and "\n" not in note
    assert f"hf download {d}" in note and f"--draft {d}" in note
