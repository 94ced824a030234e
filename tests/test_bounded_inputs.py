"""Bounded inputs and honest messages (issue 56, classes 7 to 10): every JSON file mlxspec
reads is bounded in size and nesting, model files must be regular files, calibrations
are range-checked, Session.load never downloads, and a config's faults are named as
the config's (not as corrupt weights or an unloadable tokenizer)."""

import errno
import json
import os
import pathlib
import shutil
import struct
from types import SimpleNamespace

import pytest

import mlxspec
from cli_util import assert_refused, run_cli
from mlxspec.costs import calibration as calibration_cache, cost_model
from mlxspec.models.gguf import convert as gguf
from mlxspec.models import loading, memory
from mlxspec.drafting import vocab_subset
from mlxspec.models.pinned import fetch as weights
from mlxspec.converters import convert, hub
from mlxspec.errors import MlxspecError
from mlxspec.session.session import Session

DEEP = "[" * 100_000


def model_copy(tiny_pair_dirs, tmp_path, name="m"):
    return pathlib.Path(shutil.copytree(tiny_pair_dirs[0], tmp_path / name))


def load_one(folder):
    return mlxspec.load(folder, no_draft=True)


# ---------------------------------------------------------------- 7: deeply nested JSON


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json", "generation_config.json"])
def test_deeply_nested_model_files_are_one_line_errors_naming_the_file(tiny_pair_dirs, tmp_path, name):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    (folder / name).write_text(DEEP)
    with pytest.raises(MlxspecError, match="nested too deeply") as e:
        load_one(folder)
    assert str(folder / name) in str(e.value)


def test_deep_pair_json_and_safetensors_header(tiny_pair_dirs, tmp_path):
    pair = tmp_path / "pair"
    pair.mkdir()
    (pair / "pair.json").write_text(DEEP)
    with pytest.raises(MlxspecError, match="pair.json is nested too deeply"):
        mlxspec.load(pair)
    raw = DEEP.encode()
    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(MlxspecError, match="unreadable safetensors header .*nested too deeply"):
        memory.read_local_header(f)


def test_deep_session_file(tmp_path, tiny_pair):
    path = tmp_path / "s.json"
    path.write_text(DEEP)
    with pytest.raises(MlxspecError, match="session file .* is nested too deeply"):
        Session.load(path, tiny_pair)


def test_deep_small_readers_give_up_quietly(tmp_path, monkeypatch):
    """The weights marker, a converted folder's format and a suite file: bounded too."""
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    spec = weights.CATALOG["smollm2-135m"]
    gg = weights.gguf_path(spec.name)
    gg.parent.mkdir(parents=True)
    gg.write_bytes(b"x")
    weights._marker(gg).write_text(DEEP)
    assert weights.is_present(spec.name) is False
    (tmp_path / "conv").mkdir()
    (tmp_path / "conv" / "config.json").write_text(DEEP)
    assert gguf.cached_format(tmp_path / "conv") is None
    (tmp_path / "suite.json").write_text(DEEP)
    from mlxspec.bench.prompts import load_suite

    with pytest.raises(MlxspecError, match="suite .* is nested too deeply"):
        load_suite(str(tmp_path / "suite.json"))


def test_deep_hub_config_and_index(tmp_path):
    r = SimpleNamespace(repo="org/model", files=[], offline_dir=None)
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(MlxspecError, match="org/model/config.json is nested too deeply"):
        convert.read_config(r, tmp_path)
    (tmp_path / hub.INDEX_FILE).write_text(DEEP)
    with pytest.raises(MlxspecError, match="nested too deeply"):
        hub.weight_files(r, tmp_path)


def test_a_deep_calibration_cache_is_discarded_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    (tmp_path / "k.json").write_text(DEEP[:50_000])  # under the size cap
    notes = []
    assert calibration_cache.load_cached("k", warn=notes.append) is None
    assert len(notes) == 1 and "nested too deeply" in notes[0] and "measuring again" in notes[0]


def test_a_deep_vocabulary_cache_is_discarded_with_a_note_and_rebuilt(tmp_path, monkeypatch, capsys, tiny_pair):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    tok = tiny_pair.tokenizer
    path = tmp_path / "vocab" / f"{vocab_subset.tokenizer_hash(tok)}.json"
    path.parent.mkdir(parents=True)
    path.write_text(DEEP)
    good = {"format": vocab_subset.FORMAT, "ranked": [1, 2, 3], "vocab_size": len(tok.get_vocab()),
            "tokenizer_sha256": vocab_subset.tokenizer_hash(tok)}
    monkeypatch.setattr(vocab_subset, "build_table", lambda tokenizer, say=None: dict(good))
    assert vocab_subset.cached_table(tok)["ranked"] == [1, 2, 3]
    err = capsys.readouterr().err
    assert "note: ignoring the vocabulary cache" in err and "nested too deeply" in err and "Traceback" not in err
    assert json.loads(path.read_text())["ranked"] == [1, 2, 3]  # rebuilt: the next run reads it
    assert vocab_subset.cached_table(tok)["ranked"] == [1, 2, 3] and capsys.readouterr().err == ""


def test_cli_deep_config_is_one_line(tiny_pair_dirs, tmp_path):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    (folder / "config.json").write_text(DEEP)
    before = sorted(p.name for p in folder.iterdir())
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2")
    assert_refused(res, f"{folder}/config.json is nested too deeply")
    assert sorted(p.name for p in folder.iterdir()) == before


# ---------------------------------------------------------------- 8: Session.load never downloads


def _session_file(tmp_path, model, draft=None):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "mlxspec.session.session", "version": 1, "model": model, "draft_model": draft,
                                "messages": [{"role": "user", "content": "hi"}]}))
    return path


@pytest.fixture
def no_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "empty-home"))

    def refuse(*a, **k):
        raise AssertionError("Session.load tried to download")

    monkeypatch.setattr(weights, "download_wheels", refuse)
    monkeypatch.setattr(weights, "_ensure_locked", refuse)


def test_session_load_never_downloads_a_catalog_model(tmp_path, no_downloads):
    path = _session_file(tmp_path, "smollm2-135m")
    with pytest.raises(MlxspecError) as e:
        Session.load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "mlxspec pull smollm2-135m" in msg and "never downloads" in msg


def test_session_load_names_a_missing_draft_and_an_uncached_repo(tmp_path, tiny_pair_dirs, no_downloads):
    path = _session_file(tmp_path, str(tiny_pair_dirs[0]), "qwen2.5-coder-0.5b")
    with pytest.raises(MlxspecError, match="mlxspec pull qwen2.5-coder-0.5b"):
        Session.load(path)
    path = _session_file(tmp_path, "nobody/nothing")
    with pytest.raises(MlxspecError, match="hf download nobody/nothing"):
        Session.load(path)


def test_session_load_of_local_folders_still_works(tmp_path, tiny_pair_dirs, no_downloads):
    s = Session.load(_session_file(tmp_path, str(tiny_pair_dirs[0]), str(tiny_pair_dirs[1])))
    assert s.pair.draft is not None and s.messages[0]["content"] == "hi"
    s = Session.load(_session_file(tmp_path, str(tiny_pair_dirs[0])))
    assert s.pair.draft is None


# ---------------------------------------------------------------- 9: calibration values


def _calibration(**change):
    d = {"format": cost_model.FORMAT, "draft_step": 0.3, "verify": [1.0, 1.1, 1.2], "plain_step_s": 0.01,
         "draft_widths": [1.0, 1.2]}
    d.update(change)
    return d


BAD_CALIBRATIONS = {
    "inf-draft": ('{"format": %d, "draft_step": Infinity, "verify": [1.0], "plain_step_s": 0.1}', "draft_step"),
    "huge-draft": (_calibration(draft_step=1e308), "draft_step"),
    "nan-verify": ('{"format": %d, "draft_step": 0.3, "verify": [1.0, NaN], "plain_step_s": 0.1}', "verify[1]"),
    "huge-verify": (_calibration(verify=[1.0, 1e308]), "verify[1]"),
    "negative-step": (_calibration(plain_step_s=-1), "plain_step_s"),
    "zero-width": (_calibration(draft_widths=[1.0, 0.0]), "draft_widths[1]"),
    "long-verify": (_calibration(verify=[1.0] * 1000), "verify has 1000 entries"),
    "million-widths": (_calibration(draft_widths=[1.0] * 1_000_000), "more than the 65,536 allowed"),
    "long-draft": (_calibration(draft_widths=[1.0] * 1000), "draft_widths has 1000 entries"),
    "string": (_calibration(draft_step="0.3"), "draft_step"),
    "list": ([1, 2], "not a calibration"),
}


@pytest.mark.parametrize("case", list(BAD_CALIBRATIONS))
def test_out_of_range_calibrations_are_discarded_with_a_note(tmp_path, monkeypatch, case):
    data, needle = BAD_CALIBRATIONS[case]
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    text = data % cost_model.FORMAT if isinstance(data, str) else json.dumps(data)
    (tmp_path / "k.json").write_text(text)
    notes = []
    assert calibration_cache.load_cached("k", warn=notes.append) is None
    assert len(notes) == 1 and needle in notes[0] and "\n" not in notes[0], notes


def test_a_sane_calibration_still_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    (tmp_path / "k.json").write_text(json.dumps(_calibration()))
    cm = calibration_cache.load_cached("k")
    assert cm.verify == [1.0, 1.1, 1.2] and cm.draft_widths == [1.0, 1.2] and cm.draft_step == 0.3


@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_full_disk_while_saving_a_calibration_leaves_no_temp_file(tmp_path, monkeypatch, where):
    monkeypatch.setenv("MLXSPEC_CALIBRATION_DIR", str(tmp_path))
    real_write = pathlib.Path.write_text

    def full_write(self, text, *a, **k):
        real_write(self, text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_rename(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "write":
        monkeypatch.setattr(pathlib.Path, "write_text", full_write)
    else:
        monkeypatch.setattr(calibration_cache.os, "replace", full_rename)
    cm = cost_model.CostModel(0.3, [1.0, 1.1])
    with pytest.raises(OSError):
        calibration_cache.save("k", cm)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_saving_a_vocabulary_table_leaves_no_temp_file(tmp_path, monkeypatch):
    real_write = pathlib.Path.write_text

    def full_write(self, text, *a, **k):
        real_write(self, text[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full_write)
    with pytest.raises(OSError):
        vocab_subset.write_table({"ranked": [1]}, tmp_path / "v" / "t.json")
    assert list((tmp_path / "v").iterdir()) == []


# ---------------------------------------------------------------- 10: regular files, size caps, honest messages


def test_a_safetensors_symlink_to_dev_zero_is_refused(tiny_pair_dirs, tmp_path):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    (folder / "model.safetensors").unlink()
    os.symlink("/dev/zero", folder / "model.safetensors")
    with pytest.raises(MlxspecError, match="model.safetensors is not a regular file"):
        load_one(folder)


def test_a_fifo_gguf_is_refused(tmp_path):
    os.mkfifo(tmp_path / "m.gguf")
    with pytest.raises(MlxspecError, match="GGUF file .*m.gguf is not a regular file"):
        mlxspec.load(tmp_path / "m.gguf", no_draft=True)
    with pytest.raises(MlxspecError, match="is not a regular file"):
        gguf.convert(tmp_path / "m.gguf")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_cli_fifo_model_files_are_refused_not_waited_on(tiny_pair_dirs, tmp_path, name):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2", timeout=90)
    assert_refused(res, f"{folder}/{name} is not a regular file")


def test_a_config_with_many_keys_is_refused_by_size(tiny_pair_dirs, tmp_path):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update({f"k{i}": i for i in range(200_000)})
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MlxspecError, match=r"config.json is [\d,]+ bytes, more than the 1,048,576 allowed"):
        load_one(folder)


BAD_CONFIG_FIELDS = {
    "model-type": ({"model_type": "foo"}, "config.json: unsupported model_type 'foo'"),
    "no-model-type": ({"model_type": None}, "config.json: model_type must name an architecture"),
    "rope-type": ({"rope_scaling": {"type": "bogus"}}, "config.json: rope_scaling {'type': 'bogus'} is invalid"),
    "rope-yarn": ({"rope_scaling": {"rope_type": "yarn"}}, "is invalid (field 'factor' missing)"),
    "rope-theta": ({"rope_theta": "abc"}, "config.json: rope_theta must be a positive number"),
    "rope-list": ({"rope_scaling": [1]}, "config.json: rope_scaling must be an object or null"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIG_FIELDS))
def test_config_faults_are_named_as_the_configs(tiny_pair_dirs, tmp_path, case):
    change, needle = BAD_CONFIG_FIELDS[case]
    folder = model_copy(tiny_pair_dirs, tmp_path)
    config = {**json.loads((folder / "config.json").read_text()), **change}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MlxspecError) as e:
        load_one(folder)
    msg = str(e.value)
    assert needle in msg and str(folder) in msg and "corrupt" not in msg and "tokenizer" not in msg, msg
    if case == "rope-yarn":
        res = run_cli(tmp_path, "generate", "--model", str(folder), "--no-draft", "-p", "hi", "-m", "2")
        assert_refused(res, "rope_scaling", "config.json")


def test_a_broken_tokenizer_config_is_named(tiny_pair_dirs, tmp_path):
    folder = model_copy(tiny_pair_dirs, tmp_path)
    (folder / "tokenizer_config.json").write_text("{x")
    with pytest.raises(MlxspecError, match="tokenizer_config.json is not valid JSON"):
        load_one(folder)
