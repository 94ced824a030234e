"""mlxspec never runs code from a model folder or a Hub repo (issue 10, item 1).

transformers runs a repo's own Python when `auto_map` in config.json or
tokenizer_config.json names a class and the caller does not say
`trust_remote_code=False`: it asks "Do you wish to run the custom code? [y/N]"
on stdin, so `printf 'y\\n' | mlxspec ...` ran it, from the folder itself or from
*another* repo (`other/repo--module.Class`).  Here every run gets "y" on stdin,
and every custom module writes a marker file when imported: the marker must never
appear, and whatever mlxspec writes must not carry `auto_map` on.
"""

import json

import pytest

import tiny_models as tm
from cli_util import assert_refused, run_cli
from hub_server import HubServer

NOTICE = "mlxspec never runs code from model folders"


def custom_module(marker, cls, base) -> str:
    """Python source whose import writes `marker` (it must never be imported)."""
    return (f"import pathlib\npathlib.Path({str(marker)!r}).write_text('custom code ran')\n"
            f"from transformers import {base}\n\n\nclass {cls}({base}):\n    model_type = 'qwen'\n")


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


def custom_tokenizer_folder(path, marker, prefix=""):
    """A llama folder whose tokenizer class exists only as code (auto_map -> tokenization_evil.py)."""
    folder = tm.save_model_dir(path, "llama")
    edit_json(folder / "tokenizer_config.json", tokenizer_class="EvilTokenizer",
              auto_map={"AutoTokenizer": [None, f"{prefix}tokenization_evil.EvilTokenizer"]})
    (folder / "tokenization_evil.py").write_text(custom_module(marker, "EvilTokenizer", "PreTrainedTokenizerFast"))
    return folder


def custom_config_folder(path, marker, prefix=""):
    """A model type mlx-lm knows and transformers does not (Qwen v1), with auto_map in both
    config.json and tokenizer_config.json; the tokenizer itself is an ordinary one."""
    cfg = {**tm.config_for("llama"), "model_type": "qwen", "kv_channels": 16}
    folder = tm.save_model_dir(path, "llama", model=tm.build(cfg), cfg_overrides={
        "model_type": "qwen", "kv_channels": 16,
        "auto_map": {"AutoConfig": f"{prefix}configuration_evil.EvilConfig"}})
    edit_json(folder / "tokenizer_config.json",
              auto_map={"AutoTokenizer": [None, f"{prefix}tokenization_evil.EvilTokenizer"]})
    (folder / "configuration_evil.py").write_text(custom_module(marker, "EvilConfig", "PretrainedConfig"))
    (folder / "tokenization_evil.py").write_text(custom_module(marker, "EvilTokenizer", "PreTrainedTokenizerFast"))
    return folder


def assert_no_custom_code_ran(res, marker):
    assert not marker.exists(), "custom code from the model folder ran:\n" + res.stderr
    assert "Do you wish to run the custom code" not in res.stdout + res.stderr


# ---------------------------------------------------------------- local folders


def test_local_custom_tokenizer_class_is_refused_not_run(tmp_path):
    marker = tmp_path / "MARKER"
    folder = custom_tokenizer_folder(tmp_path / "m", marker)
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2",
                  input="y\n", timeout=120)
    assert_no_custom_code_ran(res, marker)
    assert_refused(res, "needs custom code", "tokenization_evil.EvilTokenizer", "never runs")
    assert f"note: ignoring auto_map in {folder}/tokenizer_config.json: {NOTICE}" in res.stderr


def test_local_auto_map_is_ignored_and_the_model_runs(tmp_path):
    marker = tmp_path / "MARKER"
    folder = custom_config_folder(tmp_path / "m", marker)
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2", "--json",
                  input="y\n", timeout=120)
    assert_no_custom_code_ran(res, marker)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["stats"]["generated_tokens"] >= 1
    for name in ("config.json", "tokenizer_config.json"):
        assert f"note: ignoring auto_map in {folder}/{name}: {NOTICE}" in res.stderr


def test_python_api_strips_auto_map_from_what_it_loads(tmp_path, capfd):
    import mlxspec

    marker = tmp_path / "MARKER"
    pair = mlxspec.load(custom_config_folder(tmp_path / "m", marker), no_draft=True)
    assert not marker.exists()
    assert "auto_map" not in pair.target_config
    assert "auto_map" not in pair.tokenizer._tokenizer.init_kwargs
    assert NOTICE in capfd.readouterr().err


# ---------------------------------------------------------------- the Hub


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("evil")
    marker = root / "MARKER"
    code = root / "code"
    code.mkdir()
    (code / "configuration_evil.py").write_text(custom_module(marker, "EvilConfig", "PretrainedConfig"))
    (code / "tokenization_evil.py").write_text(custom_module(marker, "EvilTokenizer", "PreTrainedTokenizerFast"))
    (code / "config.json").write_text("{}")
    server = HubServer()
    server.add_repo("evil/auto-map", custom_config_folder(root / "auto-map", marker, prefix="other/repo--"))
    server.add_repo("evil/tokenizer", custom_tokenizer_folder(root / "tokenizer", marker, prefix="other/repo--"))
    server.add_repo("other/repo", code)
    server.marker = marker
    with server:
        yield server


def test_convert_never_runs_code_from_another_repo_and_writes_no_auto_map(hub, tmp_path):
    res = run_cli(tmp_path, "convert", "evil/auto-map", "--draft", "evil/auto-map", "-o", "pair", hub=hub, input="y\n")
    assert_no_custom_code_ran(res, hub.marker)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"note: ignoring auto_map in evil/auto-map/config.json: {NOTICE}" in res.stderr
    assert f"note: ignoring auto_map in evil/auto-map/tokenizer_config.json: {NOTICE}" in res.stderr
    assert not any(path.startswith("/other/repo") for _, path, *_ in hub.requests)
    pair = tmp_path / "pair"
    written = [p for p in pair.rglob("*") if p.is_file() and p.suffix != ".safetensors"]
    assert {"pair.json", "config.json", "tokenizer_config.json"} <= {p.name for p in written}
    for p in written:
        assert "auto_map" not in p.read_text(), p
        assert p.suffix != ".py", p

    res = run_cli(tmp_path, "generate", "--model", str(pair), "-p", "hi", "-m", "2", input="y\n", timeout=120)
    assert_no_custom_code_ran(res, hub.marker)
    assert res.returncode == 0, res.stderr
    assert NOTICE not in res.stderr  # nothing left to ignore


def test_convert_refuses_a_tokenizer_that_only_exists_as_code(hub, tmp_path):
    res = run_cli(tmp_path, "convert", "evil/tokenizer", "--draft", "evil/tokenizer", hub=hub, input="y\n")
    assert_no_custom_code_ran(res, hub.marker)
    assert_refused(res, "evil/tokenizer", "needs custom code", "other/repo--tokenization_evil.EvilTokenizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert not any(path.startswith("/other/repo") for _, path, *_ in hub.requests)
