"""Hostile or broken model folders give one-line errors (issue 10, item 8): pair.json
paths leading out of the pair folder, nonsense config fields, absurd safetensors
headers, a full disk while `mlxspec convert` writes, and drafter names that are
not drafters.  (GGUF names and a full disk while converting a GGUF: test_gguf.py.)"""

import json
import os
import shutil
import struct

import pytest

import mlxspec
import tiny_models as tm
from cli_util import assert_refused, file_size_limit, run_cli
from hub_server import HubServer
from mlxspec.models import memory
from mlxspec.errors import MlxspecError


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- pair.json


@pytest.mark.parametrize("kind", ["parent", "absolute", "dotdot-inside", "symlink", "itself"])
def test_pair_paths_stay_inside_the_pair_folder(tmp_path, tiny_pair_dirs, kind):
    target, draft = tiny_pair_dirs
    outside = copy_model(target, tmp_path / "outside")
    pair = tmp_path / "pair"
    copy_model(draft, pair / "draft")
    rel = {"parent": "../outside", "absolute": str(outside), "dotdot-inside": "draft/../../outside",
           "symlink": "target", "itself": "."}[kind]
    if kind == "symlink":
        os.symlink(outside, pair / "target")
    (pair / "pair.json").write_text(json.dumps({"format": "mlxspec-pair", "version": 1,
                                                "target": {"path": rel}, "draft": {"path": "draft"}}))
    with pytest.raises(MlxspecError, match="the target path .* is not a subfolder of"):
        mlxspec.load(pair)
    if kind == "parent":
        res = run_cli(tmp_path, "generate", "--model", str(pair), "-p", "hi", "-m", "2")
        assert_refused(res, f"{pair}/pair.json", "'../outside' is not a subfolder of")


def test_pair_paths_inside_still_load(tmp_path, tiny_pair_dirs):
    pair = tmp_path / "pair"
    copy_model(tiny_pair_dirs[0], pair / "t")
    copy_model(tiny_pair_dirs[1], pair / "d")
    (pair / "pair.json").write_text(json.dumps({"target": {"path": "./t"}, "draft": {"path": "d/../d"}}))
    loaded = mlxspec.load(pair)
    assert loaded.draft is not None and loaded.target_path == pair / "./t"


# ---------------------------------------------------------------- config.json and safetensors headers

BAD_CONFIGS = {
    "zero-heads": ({"num_attention_heads": 0}, "num_attention_heads must be a positive whole number, got 0"),
    "null-layers": ({"num_hidden_layers": None}, "num_hidden_layers must be a positive whole number, got null"),
    "text-hidden": ({"hidden_size": "abc"}, 'hidden_size must be a positive whole number, got "abc"'),
    "bool-vocab": ({"vocab_size": True}, "vocab_size must be a positive whole number, got true"),
    "nested": ({"text_config": {"num_key_value_heads": -2}}, "text_config.num_key_value_heads must be"),
    "quantization": ({"quantization": "4bit"}, "quantization must be an object"),
    "list": ([1, 2], "is not a JSON object (it holds a list)"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_nonsense_config_fields_are_one_line_errors(tmp_path, tiny_pair_dirs, case):
    change, message = BAD_CONFIGS[case]
    folder = copy_model(tiny_pair_dirs[0], tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config = {**config, **change} if isinstance(change, dict) else change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MlxspecError) as e:
        memory.check_pair_fits(folder)
    assert str(folder / "config.json") in str(e.value) and message in str(e.value)
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2")
    assert_refused(res, str(folder / "config.json"), message)


def test_absurd_safetensors_header_length_is_one_line_error(tmp_path, tiny_pair_dirs):
    folder = copy_model(tiny_pair_dirs[0], tmp_path / "m")
    weights = folder / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 1 << 62) + weights.read_bytes()[8:])
    with pytest.raises(MlxspecError, match="safetensors header of 4611686018427387904 bytes is implausible"):
        memory.read_local_header(weights)
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2")
    assert_refused(res, str(weights), "implausible")
    weights.write_bytes(struct.pack("<Q", 4) + b"[1] " + bytes(16))  # a header that is JSON but no object
    with pytest.raises(MlxspecError, match="not a JSON object"):
        memory.read_local_header(weights)


# ---------------------------------------------------------------- a full disk while converting


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    server = HubServer()
    server.add_repo("tiny/target", tm.save_model_dir(root / "target", seed=0))
    server.add_repo("tiny/draft", tm.save_model_dir(root / "draft", seed=1))
    with server:
        yield server


def test_full_disk_while_writing_the_pair_is_one_line_error(hub, tmp_path):
    res = run_cli(tmp_path, "convert", "tiny/target", "--draft", "tiny/draft", "-o", "first", hub=hub)
    assert res.returncode == 0, res.stdout + res.stderr  # the weights are now in the HF cache
    # the child may not write a file past 64 kB (RLIMIT_FSIZE): a real write failure, as on a full disk
    res = run_cli(tmp_path, "convert", "tiny/target", "--draft", "tiny/draft", "-o", "second", hub=hub,
                  preexec_fn=file_size_limit(64 << 10))
    assert_refused(res, f"cannot write the pair folder {tmp_path / 'second'}", "is the disk full?",
                   "nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "hf"]  # no half-written pair or temp folder


# ---------------------------------------------------------------- drafter names


@pytest.mark.parametrize("name", ["prompt_cache", "__class__", "ModelDrafter"])
def test_drafter_names_come_from_the_registry_only(tmp_path, tiny_pair_dirs, name):
    res = run_cli(tmp_path, "generate", "--model", str(tiny_pair_dirs[0]), "--drafter", name, "-p", "hi", "-m", "2")
    line = assert_refused(res, f"unknown drafter {name!r}", "--drafter", exit_code=2)  # a usage error: before loading
    for known in ("model", "lookup", "layerskip", "none"):
        assert known in line
    with pytest.raises(MlxspecError, match=f"^unknown drafter {name!r}: choose one of "):  # the API's words
        mlxspec.make_decoder(mlxspec.load(tiny_pair_dirs[0]), drafter=name)


def _nan_model_dir(path, where):
    """A tiny model folder whose weights yield NaN logits (a NaN in `where`)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    cfg = tm.config_for("llama")
    model = tm.build(cfg, seed=2, scale=2.0)
    flat = [(k, mx.full(v.shape, float("nan")) if k == where else v) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))
    return tm.save_model_dir(path, "llama", model=model)


def test_nan_logits_are_a_one_line_error_naming_the_model(tmp_path):
    """Before: empty text and finish reason "stop" (the argmax of NaNs happened to be EOS)."""


    folder = _nan_model_dir(tmp_path / "nanny", "model.norm.weight")
    r = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "5")
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "NaN" in lines[0] and "nanny" in lines[0], r.stderr
    pair = mlxspec.load(folder)
    with pytest.raises(mlxspec.MlxspecError, match="NaN"):
        mlxspec.generate(pair, [5, 6, 7], max_tokens=5)


def test_a_nan_draft_is_a_one_line_error(tmp_path):


    good = tm.save_model_dir(tmp_path / "good", "llama", model=tm.build(tm.config_for("llama"), seed=2, scale=2.0))
    bad = _nan_model_dir(tmp_path / "bad", "model.norm.weight")
    pair = mlxspec.load(good, bad)
    with pytest.raises(mlxspec.MlxspecError, match="draft model produced NaN"):
        mlxspec.generate(pair, [5, 6, 7], max_tokens=5, num_draft=3)
