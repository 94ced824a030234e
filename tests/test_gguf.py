"""mlxspec.models.gguf.convert: GGUF -> mlx-lm model folders.

Fast tests write tiny GGUF files here (from random mlx-lm models, laid out the way
llama.cpp's converter lays them out: Q/K permuted for llama, norms stored as 1+w
for Gemma 3) and check that the converted model computes the same logits as the
original.  `real` tests use SmolLM2-135M (fetched with mlxspec.models.pinned.fetch).
"""

import json
import re
import shutil

import mlxspec  # noqa: F401  (preloads OpenBLAS before mlx.core)
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load as mlx_lm_load

import tiny_models
from cli_util import assert_refused, file_size_limit, run_cli
from mlxspec.models.gguf import convert as gguf, storage as gguf_storage
from mlxspec.models import loading
from mlxspec.models.pinned import fetch as weights
from mlxspec.device import compute_dtype
from mlxspec.errors import MlxspecError

# ---------------------------------------------------------------- tiny GGUF files

# mlx-lm name -> llama.cpp name, written out independently of mlxspec.models.gguf.convert's tables.
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
GEMMA_LAYER = {
    **LAYER, "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}


def llama_cpp_name(name, arch):
    module, kind = name.rsplit(".", 1)
    if m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", module):
        return f"blk.{m.group(1)}.{(GEMMA_LAYER if arch == 'gemma3' else LAYER)[m.group(2)]}.{kind}"
    return f"{TOP[module]}.{kind}"


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf `LlamaModel.permute`: rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_config(arch):
    if arch == "gemma3":
        return {
            "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "vocab_size": 300, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "query_pre_attn_scalar": 16,
            "sliding_window": 4, "sliding_window_pattern": 6, "max_position_embeddings": 1024,
        }
    cfg = tiny_models.config_for(arch)
    cfg["tie_word_embeddings"] = arch == "llama"
    return cfg


def tiny_model(arch, seed=0):
    """A random mlx-lm model whose norm weights are random too (so swapped norms show)."""
    cfg = tiny_config(arch)
    model = tiny_models.build(cfg, seed=seed, scale=3.0)
    if arch == "gemma3":
        model.sanitize({})  # no lm_head.weight: tie the embeddings, as a GGUF without output.weight does
    rng = np.random.default_rng(seed + 1)
    norms = [(k, mx.array(rng.normal(1.0, 0.2, v.shape).astype(np.float32)))
             for k, v in tree_flatten(model.parameters()) if "norm" in k]
    model.update(tree_unflatten(norms))
    mx.eval(model.parameters())
    return model, cfg


def write_gguf(path, arch, model, cfg, quant=(), pre="qwen2", add_bos=False, with_template=True,
               extra_tensor=None, name=None, tokens=None):
    """Write `model` as llama.cpp would; tensors whose GGUF name contains a string in `quant` go Q8_0.
    Returns {mlx name: float32 weights the file really holds (after Q8_0 round trip)}."""
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}" if name is None else name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma3":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_sliding_window(cfg["sliding_window"])
    vocab, merges = tiny_models.vocab_list(cfg["vocab_size"])
    tokens = vocab if tokens is None else tokens  # the same tokens in another order: another tokenizer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in tiny_models.SPECIALS else 1 for t in tokens])
    w.add_token_merges([f"{a} {b}" for a, b in merges[: len(tokens) - 261]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    if with_template:
        w.add_chat_template(tiny_models.CHATML)

    held = {}
    for name, v in tree_flatten(model.parameters()):
        a = np.array(v, dtype=np.float32)
        held[name] = a
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = permute(a, cfg["num_attention_heads"])
        if arch == "llama" and name.endswith("k_proj.weight"):
            a = permute(a, cfg["num_key_value_heads"])
        if arch == "gemma3" and "norm" in name:
            a = a + np.float32(1.0)
            held[name] = a - np.float32(1.0)  # what the file can give back
        gname = llama_cpp_name(name, arch)
        if a.ndim == 2 and any(q in gname for q in quant):
            data = gguf_quantize(a, Q.Q8_0)
            w.add_tensor(gname, data, raw_dtype=Q.Q8_0)
            back = gguf_dequantize(data, Q.Q8_0).reshape(a.shape)
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                raise ValueError("keep permuted tensors F32 in these tests")
            held[name] = back
        else:
            w.add_tensor(gname, np.ascontiguousarray(a))
    if extra_tensor:
        w.add_tensor(extra_tensor, np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def logits(model, ids):
    out = model(mx.array([ids]))
    mx.eval(out)
    return np.array(out[0])


IDS = [1, 50, 77, 120, 200, 33, 5, 260, 299, 7]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def cache_entries(home):
    """Everything in the models cache, hidden temp folders included."""
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


@pytest.mark.parametrize(
    "arch,quant",
    [("llama", ()), ("qwen2", ("ffn_", "token_embd", "output.", "attn_v")), ("gemma3", ("ffn_up", "token_embd"))],
)
def test_tiny_gguf_converts_to_the_same_model(tmp_path, home, arch, quant):
    model, cfg = tiny_model(arch)
    held = write_gguf(tmp_path / f"{arch}.gguf", arch, model, cfg, quant=quant)
    folder = gguf.convert(tmp_path / f"{arch}.gguf", progress=False)
    assert folder.parent == home / "models" and folder.name == weights.sha256_file(tmp_path / f"{arch}.gguf")

    converted, tok = mlx_lm_load(str(folder))
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == {"gemma3": "gemma3_text"}.get(arch, arch)
    assert config["tie_word_embeddings"] == (arch != "qwen2")
    assert config.get("rope_traditional", False) == (arch == "llama")
    assert config["mlxspec"]["general.name"] == f"tiny {arch}"
    changes = []
    for name, v in tree_flatten(converted.parameters()):
        # on disk: float16 matrices, float32 vectors (norms); the values are the held ones, rounded once
        assert v.dtype == (mx.float16 if v.ndim > 1 else mx.float32), name
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            continue  # stored permuted, by design
        np.testing.assert_array_equal(np.array(v), held[name].astype(np.array(v).dtype), err_msg=name)
        changes.append(np.abs(held[name].astype(np.float16).astype(np.float32) - held[name]).max())
    storage = config["mlxspec"]["storage"]
    assert storage["dtype"] == "float16" and storage["float32_matrices"] == 0
    assert storage["max_abs_change"] == pytest.approx(max(changes), rel=1e-6) and 0 < max(changes) < 1e-3
    assert 0 < storage["max_rel_change"] <= 2.0 ** -11  # float16 rounds to nearest: half an ulp

    computed, _, _ = loading.load_model_dir(folder)  # what mlxspec computes with: float32 on the CPU
    assert {v.dtype for _, v in tree_flatten(computed.parameters())} == {mx.float32}
    reference, _ = tiny_model(arch)
    reference.update(tree_unflatten([(k, mx.array(v)) for k, v in held.items()]))
    ref, got = logits(reference, IDS), logits(computed, IDS)
    assert ref.shape == got.shape == (len(IDS), cfg["vocab_size"])
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


def test_matrices_float16_cannot_hold_stay_float32():
    big = np.array([[1.0, 7.0e4], [2.0, 3.0]], np.float32)  # 7e4 > float16's largest finite value
    small = np.array([[1.0, 1.0e-3], [2.0, 3.0e-9]], np.float32)
    norm = np.array([1.0, 1.0e-3], np.float32)
    assert gguf_storage.to_storage(big) is big
    assert gguf_storage.to_storage(norm) is norm
    assert gguf_storage.to_storage(small).dtype == np.float16
    r = gguf_storage.Rounding()
    for w in (big, small, norm):
        r.add(w, gguf_storage.to_storage(w))
    assert r.float32_matrices == 1
    assert 0 < r.max_abs < 1e-6
    assert r.max_rel <= 2.0 ** -11  # 3e-9 is subnormal in float16: counted in the absolute change only


def rounding_direct(tensors) -> tuple[float, float]:
    """The largest absolute and relative change, over whole arrays at once."""
    max_abs = max_rel = 0.0
    for w in tensors:
        diff = np.abs(w.astype(np.float16).astype(np.float32) - w)
        normal = np.abs(w) >= gguf_storage.NORMAL_MIN
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff[normal] / np.abs(w[normal])).max()) if normal.any() else 0.0)
    return max_abs, max_rel


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, gguf_storage.CHUNK_ELEMENTS])
def test_rounding_in_chunks_equals_the_whole_array_figures(chunk):
    """Rows of any width, counts no multiple of the chunk, rows with no weight in float16's normal range."""
    rng = np.random.default_rng(chunk)
    tensors = [rng.normal(0, s, shape).astype(np.float32)
               for s, shape in ((0.02, (37, 13)), (3.0, (5, 200)), (1.0, (11, 3, 7)), (0.5, (1, 1)))]
    tensors[0][:9] *= 1e-4  # below float16's normal range: absolute change only
    r = gguf_storage.Rounding()
    for w in tensors:
        r.add(w, gguf_storage.to_storage(w), chunk=chunk)
    assert (r.max_abs, r.max_rel) == rounding_direct(tensors) and r.max_abs > 0 and r.max_rel > 0


def test_rounding_memory_is_bounded_by_the_chunk():
    """Extra memory while measuring a 16 MB matrix: a chunk's worth (~0.4 MB here), not the matrix's."""
    import tracemalloc

    w = np.random.default_rng(0).normal(0, 0.02, (2048, 2048)).astype(np.float32)
    stored = gguf_storage.to_storage(w)
    r = gguf_storage.Rounding()
    tracemalloc.start()
    try:
        r.add(w, stored, chunk=1 << 15)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert (r.max_abs, r.max_rel) == rounding_direct([w])


def test_float16_storage_switched_off_writes_float32_folders(tmp_path, home):
    """`convert_into(..., float16=False)` (benchmarks/storage_dtype.py's float32 folder): every
    tensor float32 and unrounded, a folder of the float32 format, that loads and computes as the
    model the GGUF holds -- and as the float16 folder does, within float16's rounding."""
    model, cfg = tiny_model("qwen2")
    src = tmp_path / "q.gguf"
    held = write_gguf(src, "qwen2", model, cfg, quant=("ffn_", "attn_v"))
    f16, f32 = gguf.convert(src, progress=False), tmp_path / "f32"
    f32.mkdir()
    gguf.convert_into(src, f32, gguf.sha256_file(src), progress=False, float16=False)

    config = json.loads((f32 / "config.json").read_text())
    assert config["mlxspec"]["format"] == gguf.FLOAT32_FORMAT == 1 and 1 in gguf.READABLE_FORMATS
    assert config["torch_dtype"] == "float32"
    saved = mx.load(str(f32 / "model.safetensors"))
    assert saved.keys() == held.keys()
    for name, v in saved.items():
        assert v.dtype == mx.float32, name
        np.testing.assert_array_equal(np.array(v), held[name], err_msg=name)
    storage = config["mlxspec"]["storage"]
    assert storage == {"dtype": "float32", "max_abs_change": 0.0, "max_rel_change": 0.0,
                       "float32_matrices": sum(v.ndim > 1 for v in saved.values())}
    assert gguf.cached_format(f16) == gguf.FORMAT == 2  # the cache entry itself stays float16

    reference, _ = tiny_model("qwen2")
    reference.update(tree_unflatten([(k, mx.array(v)) for k, v in held.items()]))
    ref = logits(reference, IDS)
    got32 = logits(loading.load_model_dir(f32)[0], IDS)
    got16 = logits(loading.load_model_dir(f16)[0], IDS)
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_allclose(got16, got32, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_unpermuted_llama_would_be_wrong(tmp_path, home):
    """The permutation test above can fail: without rope_traditional the logits differ."""
    model, cfg = tiny_model("llama")
    write_gguf(tmp_path / "l.gguf", "llama", model, cfg)
    folder = gguf.convert(tmp_path / "l.gguf", progress=False)
    wrong, _ = mlx_lm_load(str(folder), model_config={"rope_traditional": False})
    assert np.abs(logits(wrong, IDS) - logits(model, IDS)).max() > 1e-2


def test_tokenizer_files_from_metadata(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg, add_bos=True)
    folder = gguf.convert(tmp_path / "q.gguf", progress=False)
    _, tok = mlx_lm_load(str(folder))
    ids = tok.encode("the tea")
    assert ids[0] == 1 and tok.decode(ids[1:]) == "the tea"  # BOS added, as the file asks
    assert tok.eos_token == "</s>"
    assert tok.eos_token_ids == {2, 4}  # EOS, and <|im_end|>: a control token llama.cpp stops on
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [3]  # control tokens stay whole


def meta_with_digit_merge(pre):
    tokens = tiny_models.SPECIALS + tiny_models.byte_tokens() + ["12"]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * 5 + [1] * 257,
        "tokenizer.ggml.merges": ["1 2"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }


def test_smollm_pretokenizer_splits_digits():
    from tokenizers import Tokenizer

    smollm = Tokenizer.from_str(gguf.tokenizer_files(meta_with_digit_merge("smollm"))[0])
    plain = Tokenizer.from_str(gguf.tokenizer_files(meta_with_digit_merge("gpt2"))[0])
    assert plain.encode("a12").tokens == ["a", "12"]  # the merge applies without the digit split
    assert smollm.encode("a12").tokens == ["a", "1", "2"]
    assert smollm.decode(smollm.encode("x 12, 3").ids) == "x 12, 3"


def test_second_convert_returns_the_cache_entry_without_reading(tmp_path, home, monkeypatch):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg)
    first = gguf.convert(tmp_path / "q.gguf", progress=False)
    monkeypatch.setattr(gguf, "open_gguf", lambda *a: pytest.fail("converted again"))
    copy = tmp_path / "elsewhere.gguf"
    shutil.copy(tmp_path / "q.gguf", copy)
    assert gguf.convert(tmp_path / "q.gguf") == first
    assert gguf.convert(copy) == first  # keyed by content, not by path
    assert cache_entries(home) == [first.name]


def test_cache_entry_of_the_float32_format_keeps_working(tmp_path, home, monkeypatch):
    """Format 1 folders (float32, mlxspec 0.1) are used as they are: no surprise re-conversion."""
    model, cfg = tiny_model("qwen2")
    held = write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg)
    folder = gguf.convert(tmp_path / "q.gguf", progress=False)
    config = json.loads((folder / "config.json").read_text())
    config["mlxspec"]["format"] = 1
    del config["mlxspec"]["storage"]
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in held.items()},
                        metadata={"format": "mlx"})  # what 0.1 wrote: every tensor float32, unrounded
    monkeypatch.setattr(gguf, "open_gguf", lambda *a: pytest.fail("converted again"))
    assert gguf.convert(tmp_path / "q.gguf", progress=False) == folder
    computed, _, _ = loading.load_model_dir(folder)
    np.testing.assert_allclose(logits(computed, IDS), logits(model, IDS), rtol=1e-4, atol=1e-3)


def test_cache_entry_of_an_unknown_format_is_redone(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg)
    folder = gguf.convert(tmp_path / "q.gguf", progress=False)
    config = json.loads((folder / "config.json").read_text())
    config["mlxspec"]["format"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"stale")
    assert gguf.convert(tmp_path / "q.gguf", progress=False) == folder
    assert gguf.cached_format(folder) == gguf.FORMAT
    assert cache_entries(home) == [folder.name]
    computed, _, _ = loading.load_model_dir(folder)
    ref = logits(model, IDS)
    np.testing.assert_allclose(logits(computed, IDS), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def corrupt(src, dst, how, data_offset=None):
    """A damaged copy of `src`; `data_offset`: where the first tensor's data starts (read if not given)."""
    data = bytearray(src.read_bytes())
    if data_offset is None:
        data_offset = GGUFReader(src).tensors[0].data_offset
    if how == "truncated":
        data = data[: len(data) * 2 // 3]
    elif how == "truncated-header":
        data = data[:300]
    elif how == "flipped-data":  # 0xFF over the first tensor's first blocks: NaN scales / NaN floats
        data[data_offset:data_offset + 512] = b"\xff" * 512
    elif how == "flipped-header":
        data[24:40] = bytes(b ^ 0xFF for b in data[24:40])
    elif how == "not-gguf":
        data = b"PK\x03\x04" + bytes(1000)
    dst.write_bytes(bytes(data))
    return dst


def assert_one_line_error(path, home, match=None):
    with pytest.raises(MlxspecError) as e:
        gguf.convert(path, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    if match:
        assert re.search(match, msg), msg
    assert cache_entries(home) == []  # no entry, no half-written temp folder


@pytest.mark.parametrize("how", ["truncated", "truncated-header", "flipped-data", "flipped-header", "not-gguf"])
def test_corrupt_tiny_gguf_is_one_line_error_and_no_cache_entry(tmp_path, home, how):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg, quant=("token_embd",))
    assert_one_line_error(corrupt(tmp_path / "q.gguf", tmp_path / f"{how}.gguf", how), home)


def test_unsupported_files_name_the_file(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "extra.gguf", "qwen2", model, cfg, extra_tensor="blk.0.mystery.weight")
    assert_one_line_error(tmp_path / "extra.gguf", home, "unsupported tensor 'blk.0.mystery.weight'")
    write_gguf(tmp_path / "phi.gguf", "phi3", model, cfg)
    assert_one_line_error(tmp_path / "phi.gguf", home, "architecture 'phi3' is not supported")
    assert_one_line_error(tmp_path / "missing.gguf", home, "no such GGUF file")


def test_expected_hash_is_compared_before_anything_is_converted(tmp_path, home, monkeypatch):
    model, cfg = tiny_model("qwen2")
    path = tmp_path / "q.gguf"
    write_gguf(path, "qwen2", model, cfg)
    digest = gguf.sha256_file(path)
    with pytest.raises(gguf.ChecksumMismatch) as e:
        gguf.convert(path, progress=False, expected_sha256="0" * 64)
    assert isinstance(e.value, MlxspecError) and "\n" not in str(e.value)
    assert "corrupt" in str(e.value) and str(path) in str(e.value) and digest in str(e.value)
    assert cache_entries(home) == []
    assert gguf.convert(path, progress=False, expected_sha256=digest.upper()).name == digest


def test_escape_sequences_in_the_name_never_reach_the_terminal(tmp_path, home):
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg, name="\x1b[31mred\x1b]0;title\x07 \u202eevil\r\nx")
    folder = gguf.convert(tmp_path / "q.gguf", progress=False)
    shown = "\\x1b[31mred\\x1b]0;title\\x07 \\u202eevil\\x0d\\x0ax"
    assert json.loads((folder / "config.json").read_text())["mlxspec"]["general.name"] == shown
    res = run_cli(tmp_path, "generate", "--model", str(tmp_path / "q.gguf"), "--no-draft", "-p", "hi", "-m", "2",
                  MLXSPEC_HOME=str(home))
    assert res.returncode == 0, res.stderr
    assert f"[{shown} (GGUF, " in res.stderr and "; no draft model;" in res.stderr
    assert not any(c in res.stderr for c in "\x1b\x07\r\u202e")
    # a folder converted before names were escaped, or any other config naming the model
    from mlxspec.models.loading import model_name

    assert model_name(folder, {"mlxspec": {"general.name": "\x1b[2Jwiped"}}) == "\\x1b[2Jwiped"
    assert model_name(tmp_path / "dir\x1b[1mname", {}) == "dir\\x1b[1mname"


def test_full_disk_while_converting_is_one_line_error_and_no_cache_entry(tmp_path, home):
    """A real write failure: the child may not write a file past 64 kB (RLIMIT_FSIZE), so
    MLX's safetensors writer fails half-way, as on a full disk."""
    model, cfg = tiny_model("qwen2")
    write_gguf(tmp_path / "q.gguf", "qwen2", model, cfg)
    res = run_cli(tmp_path, "generate", "--model", str(tmp_path / "q.gguf"), "--no-draft", "-p", "hi", "-m", "2",
                  MLXSPEC_HOME=str(home), preexec_fn=file_size_limit(64 << 10))
    assert_refused(res, str(tmp_path / "q.gguf"), "cannot write the converted model", "is the disk full?")
    assert cache_entries(home) == []


# ---------------------------------------------------------------- SmolLM2-135M (real)


@pytest.fixture(scope="session")
def smollm_gguf():
    return weights.ensure("smollm2-135m")


@pytest.fixture(scope="session")
def smollm_data_offset(smollm_gguf):
    return GGUFReader(smollm_gguf).tensors[0].data_offset


@pytest.fixture(scope="session")
def smollm_dir(smollm_gguf):
    return gguf.convert(smollm_gguf)


@pytest.fixture(scope="session")
def smollm(smollm_dir):
    """mlx-lm's own loader on the converted folder, computing in the dtype mlxspec does
    (float32 on the CPU, where the folder's float16 weights would run ~4x slower)."""
    model, tokenizer = mlx_lm_load(str(smollm_dir))
    if compute_dtype() is not None:
        model.set_dtype(compute_dtype())
    return model, tokenizer


def greedy(model, tokenizer, messages, max_tokens=24):
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    cache = make_prompt_cache(model)
    out = model(mx.array([prompt]), cache=cache)
    tokens = []
    for _ in range(max_tokens):
        token = int(mx.argmax(out[0, -1]).item())
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
        out = model(mx.array([[token]]), cache=cache)
    return tokens


@pytest.mark.real
def test_smollm2_tokenizer(smollm):
    _, tok = smollm
    assert tok.encode("Hello world") == [19556, 905]
    assert len(tok.encode("In 2024", add_special_tokens=False)) == 6  # In, space, 2, 0, 2, 4: digits split
    assert tok.decode(tok.encode("In 2024, 12345 people")) == "In 2024, 12345 people"
    assert tok.eos_token == "<|im_end|>" and 2 in tok.eos_token_ids


@pytest.mark.real
def test_smollm2_chat_template_renders(smollm):
    _, tok = smollm
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.real
def test_smollm2_weights_match_mlx_own_gguf_reader(smollm_gguf, smollm_dir):
    """An independent dequantisation: mx.load reads Q4_1/Q8_0 GGUF natively as quantized triplets."""
    native = mx.load(str(smollm_gguf))
    ours = {}
    for f in sorted(smollm_dir.glob("model*.safetensors")):
        ours.update(mx.load(str(f)))
    assert len(ours) == 272
    for gname in {k.rsplit(".", 1)[0] for k in native}:
        w = native[f"{gname}.weight"]
        if f"{gname}.scales" in native:
            scales = native[f"{gname}.scales"].astype(mx.float32)
            biases = native[f"{gname}.biases"].astype(mx.float32)
            bits = 32 * w.shape[-1] // (scales.shape[-1] * 32)
            w = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
        name = gguf.mlx_name(f"{gname}.weight", "llama")
        stored16 = w.ndim > 1 and gguf.cached_format(smollm_dir) >= 2  # format 1 (mlxspec 0.1): all float32
        assert ours[name].dtype == (mx.float16 if stored16 else mx.float32), name
        # float16 storage: within half an ulp of MLX's own dequantisation (plus float32 noise)
        np.testing.assert_allclose(np.array(ours[name].astype(mx.float32)), np.array(w), rtol=2.0 ** -11 + 1e-5,
                                   atol=1e-7, err_msg=name)


@pytest.mark.real
def test_smollm2_greedy_generation_is_deterministic_and_coherent(smollm):
    # Asserting on a few content words rather than one exact string: the argmax can tip on a
    # near-tie under a different BLAS, thread count or MLX version, which would make an exact
    # string flaky without telling us more; garbled weights, a wrong RoPE layout or a broken
    # tokenizer all lose these words at once.
    model, tok = smollm
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = greedy(model, tok, messages)
    assert first == greedy(model, tok, messages)
    text = tok.decode(first)
    assert "Paris" in text, text
    story = tok.decode(greedy(model, tok, [{"role": "user", "content": "Write one sentence about a cat."}], 30))
    words = re.findall(r"[A-Za-z]+", story)
    assert len(words) >= 5 and re.search(r"\bcat", story, re.I), story
    assert sum(w.lower() in {"the", "a", "cat", "is", "was", "and", "on", "in", "of", "her", "his", "its"}
               for w in words) >= 2, story


@pytest.mark.real
def test_smollm2_cached_convert_is_immediate(smollm_gguf, smollm_dir, monkeypatch):
    monkeypatch.setattr(gguf, "open_gguf", lambda *a: pytest.fail("converted again"))
    assert gguf.convert(smollm_gguf) == smollm_dir


@pytest.mark.real
@pytest.mark.parametrize("how", ["truncated", "flipped-data"])
def test_smollm2_corrupt_copy_is_one_line_error_and_no_cache_entry(smollm_gguf, smollm_data_offset, tmp_path,
                                                                   home, how):
    bad = corrupt(smollm_gguf, tmp_path / f"smollm2-{how}.gguf", how, smollm_data_offset)
    assert_one_line_error(bad, home, r"not a valid or complete GGUF file \((ValueError|tensor token_embd)")
