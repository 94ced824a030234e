"""`mlxspec convert` / `mlxspec pairs` against a Hub served from loopback (tests/hub_server.py).

The CLI runs in a subprocess with HF_ENDPOINT / HF_HOME / HF_TOKEN set, so the
real huggingface_hub client reads them exactly as it would for a user (it reads
some at import time).  The server counts the tensor-data bytes it serves.
"""

import json
import struct
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner

import tiny_models as tm
from cli_util import assert_refused, run_cli
from hub_server import HubServer
from mlxspec.models import memory
from mlxspec.converters import catalog
from mlxspec.converters.cli import pairs as pairs_cmd
from mlxspec.errors import MlxspecError

T, D = "tiny/target", "tiny/draft"


def data_bytes(folder) -> int:
    """Tensor-data bytes of a folder's model.safetensors (what a full download serves)."""
    blob = (Path(folder) / "model.safetensors").read_bytes()
    return len(blob) - 8 - struct.unpack("<Q", blob[:8])[0]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    cfg = tm.config_for("llama")
    target = tm.build(cfg, seed=0, scale=3.0)
    dirs = {
        T: tm.save_model_dir(root / "target", model=target),
        D: tm.save_model_dir(root / "draft", model=tm.perturbed(target, cfg, noise=0.05)),
        "tiny/draft-padded": tm.save_model_dir(root / "padded", vocab_size=384, tokenizer_vocab=300, seed=2),
        "tiny/draft-renamed": tm.save_model_dir(root / "renamed", seed=3, rename={7: "<renamed>"}),
        "tiny/draft-eos": tm.save_model_dir(root / "eos", seed=4, eos="<|im_end|>"),
    }
    pickle_dir = root / "pickle"
    pickle_dir.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (pickle_dir / f).write_bytes((dirs[T] / f).read_bytes())
    (pickle_dir / "pytorch_model.bin").write_bytes(b"PK\x03\x04" + bytes(8192))
    server = HubServer()
    for repo, folder in dirs.items():
        server.add_repo(repo, folder)
    server.add_repo("tiny/gated", dirs[T], gated=True)
    server.add_repo("tiny/pickle", pickle_dir)
    server.add_repo("tiny/huge", dirs[D], fake_sizes={"model.safetensors": 10**15})
    server.dirs = dirs
    with server:
        yield server


@pytest.fixture
def fresh(hub):
    hub.reset_counters()
    return hub


def assert_nothing_written(tmp_path):
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "hf") == []


# ---------------------------------------------------------------- conversions


def test_compatible_pair_converts_then_generates_and_reconverts_offline(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", T, "--draft", D, hub=fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "target+draft"  # the default name
    assert "quantisation: none (default on the CPU backend" in res.stdout
    assert f"output: {out} (default" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "target+draft"]  # no temp folder left

    m = json.loads((out / "pair.json").read_text())
    assert m["format"] == "mlxspec-pair" and m["version"] == 1 and m["quantization"] == "none"
    assert m["target"] == {"path": "target", "repo": T, "revision": fresh.repos[T].sha}
    assert m["draft"] == {"path": "draft", "repo": D, "revision": fresh.repos[D].sha}
    assert m["compatibility"]["ok"] and m["memory"]["fits"] and m["mlxspec_version"]
    for sub in ("target", "draft"):
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
            p.name for p in (out / sub).iterdir()}
    # the draft head's token frequency table, made for the draft's tokenizer
    from mlxspec.drafting import vocab_subset
    from mlxspec.models.model_files import load_tokenizer

    table = json.loads((out / vocab_subset.FILE_NAME).read_text())
    assert "stdlib" in table["corpus"] and table["ranked"]
    assert vocab_subset.check_table(table, load_tokenizer(out / "draft", None, "draft"), "t") == table["ranked"]
    # unquantised: the converted weights are the served ones, bit for bit
    src, dst = mx.load(str(fresh.dirs[T] / "model.safetensors")), mx.load(str(out / "target/model.safetensors"))
    assert src.keys() == dst.keys() and all(mx.array_equal(src[k], dst[k]).item() for k in src)
    # each weight byte was served exactly once
    assert fresh.weight_bytes(T) == data_bytes(fresh.dirs[T]) and fresh.weight_bytes(D) == data_bytes(fresh.dirs[D])

    import mlxspec
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    prompt = [7, 42, 99, 150, 260]
    got = mlxspec.generate(mlxspec.load(out), prompt, max_tokens=12).tokens
    model, _ = load(str(out / "target"))
    plain = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=len(got))]
    assert len(got) >= 1 and got == plain

    # offline: the same pair again from the cache, without a single request
    n = len(fresh.requests)
    res = run_cli(tmp_path, "convert", T, "--draft", D, "-o", "again", hub=fresh, HF_HUB_OFFLINE="1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "again/pair.json").is_file() and len(fresh.requests) == n


def test_padded_draft_vocab_accepted_and_quantised(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", T, "--draft", "tiny/draft-padded", "-o", "pair", "--quantize", "4", hub=fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    m = json.loads((tmp_path / "pair/pair.json").read_text())
    assert m["quantization"] == "4" and m["compatibility"]["ok"]
    assert (m["compatibility"]["target_vocab"], m["compatibility"]["draft_vocab"]) == (300, 300)
    dcfg = json.loads((tmp_path / "pair/draft/config.json").read_text())
    assert dcfg["vocab_size"] == 384 and dcfg["quantization"]["bits"] == 4
    import mlxspec

    pair = mlxspec.load(tmp_path / "pair")
    assert len(mlxspec.generate(pair, [7, 42, 99], max_tokens=4).tokens) >= 1

    # an already-quantised (MLX) repo is kept as it is, and not re-quantised to other bits
    fresh.add_repo("tiny/target-4bit", tmp_path / "pair/target")
    res = run_cli(tmp_path, "convert", "tiny/target-4bit", "--draft", "tiny/target-4bit", "-o", "pre", hub=fresh)
    assert res.returncode == 0 and "4-bit (pre-quantised)" in res.stdout, res.stdout + res.stderr
    assert json.loads((tmp_path / "pre/pair.json").read_text())["quantization"] == "4"
    assert_refused(run_cli(tmp_path, "convert", "tiny/target-4bit", "--draft", D, "-q", "8", hub=fresh),
                   "already 4-bit")


def test_interrupted_download_leaves_nothing_and_rerun_resumes(fresh, tmp_path):
    # the draft is fetched second; cut it mid-file and fail the retry
    fresh.interrupt(D, "model.safetensors", after=100_000, then_status=500)
    res = run_cli(tmp_path, "convert", T, "--draft", D, "-o", "pair", hub=fresh)
    assert_refused(res, D, "run the same command again")
    assert_nothing_written(tmp_path)
    assert fresh.weight_bytes(T) == data_bytes(fresh.dirs[T])

    fresh.reset_counters()
    fresh.interrupt(D, "model.safetensors", after=100_000)  # one more cut-off, this time transient
    res = run_cli(tmp_path, "convert", T, "--draft", D, "-o", "pair", hub=fresh)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "pair/pair.json").is_file()
    assert fresh.weight_bytes(T) == 0  # the finished file was kept in the HF cache
    # huggingface_hub retried within the run; it resumes from its last full 10 MB chunk,
    # so for this small file the 100 kB already served came again
    header = 8 + struct.unpack("<Q", (fresh.dirs[D] / "model.safetensors").read_bytes()[:8])[0]
    assert fresh.weight_bytes(D) == data_bytes(fresh.dirs[D]) + 100_000 - header


# ---------------------------------------------------------------- refusals


def test_changed_token_text_refused_naming_the_id(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", T, "--draft", "tiny/draft-renamed", hub=fresh)
    assert_refused(res, "token 7 differs", "'<renamed>'")
    assert_nothing_written(tmp_path)
    assert fresh.weight_bytes() == 0


def test_different_eos_refused(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", T, "--draft", "tiny/draft-eos", hub=fresh)
    assert_refused(res, "EOS ids differ")
    assert_nothing_written(tmp_path)
    assert fresh.weight_bytes() == 0


def test_over_budget_refused_before_any_weight_byte(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", T, "--draft", D, "--budget", "0.004", "--context", "8192", hub=fresh)
    assert_refused(res, "over budget", "nothing was downloaded")
    for row in ("target weights", "draft weights", "target KV cache (8192 tokens", "total", "does NOT fit"):
        assert row in res.stdout
    assert_nothing_written(tmp_path)
    assert fresh.weight_bytes() == 0
    # the headers were read remotely, with range requests
    header_reads = [r for r in fresh.requests if r[0] == "GET" and r[1].endswith(".safetensors")]
    assert len(header_reads) == 4 and all(r[2] and r[3] == 206 for r in header_reads)


def test_gated_repo_needs_a_token(fresh, tmp_path):
    res = run_cli(tmp_path, "convert", "tiny/gated", "--draft", D, hub=fresh)
    assert_refused(res, "tiny/gated is gated", "HF_TOKEN")
    res = run_cli(tmp_path, "convert", "tiny/gated", "--draft", D, "--budget", "0.001", hub=fresh, HF_TOKEN="hf_wrong")
    assert_refused(res, "your token has no access")
    # with the right token it gets past the gate (to the budget check)
    res = run_cli(tmp_path, "convert", "tiny/gated", "--draft", D, "--budget", "0.001", hub=fresh, HF_TOKEN=fresh.token)
    assert_refused(res, "over budget")
    assert_nothing_written(tmp_path)
    assert fresh.weight_bytes() == 0


def test_missing_repo_pickle_only_disk_full_and_network_down(fresh, tmp_path):
    assert_refused(run_cli(tmp_path, "convert", "tiny/nope", "--draft", D, hub=fresh), "tiny/nope not found")
    assert_refused(run_cli(tmp_path, "convert", "tiny/pickle", "--draft", D, hub=fresh),
                   "only pickle weights", "pytorch_model.bin", "safetensors only")
    assert_refused(run_cli(tmp_path, "convert", T, "--draft", "tiny/huge", hub=fresh), "not enough disk space")
    assert fresh.weight_bytes() == 0
    with socket_closed() as url:
        assert_refused(run_cli(tmp_path, "convert", T, "--draft", D, endpoint=url), f"cannot reach the Hub at {url}")
    assert_nothing_written(tmp_path)


def socket_closed():
    """A loopback URL with nothing listening."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def cm():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        yield f"http://127.0.0.1:{port}"

    return cm()


# ---------------------------------------------------------------- memory and catalog


def test_memory_arithmetic():
    cfg = tm.config_for("llama", layers=3, hidden=64, heads=4, kv_heads=2)
    assert memory.kv_cache_bytes(cfg, 1000, 2) == 3 * 2 * 16 * 2 * 1000 * 2
    assert memory.kv_cache_bytes({**cfg, "head_dim": 32}, 10, 4) == 3 * 2 * 32 * 2 * 10 * 4
    # 4-bit: half a byte per weight plus a scale and a bias per 64-group; 1-D tensors stay float
    assert memory.tensor_bytes("BF16", (128, 64), quantize_bits=4) == 128 * 64 // 2 + 128 * 2 * 2
    assert memory.tensor_bytes("BF16", (64,), quantize_bits=4, float_bytes=4) == 256
    assert memory.tensor_bytes("BF16", (10, 60), quantize_bits=4) == 1200  # 60 % 64 != 0: not quantised
    b = memory.Budget([("a", 3 << 30), ("b", 1 << 30)], usable=4 << 30, usable_source="test", context=1)
    assert b.fits and not memory.Budget(b.rows, (4 << 30) - 1, "test", 1).fits
    assert "4.00 GiB" in b.table() and b.to_dict()["total_bytes"] == 4 << 30


def test_header_budget_matches_the_file(hub, tmp_path):
    folder = hub.dirs[T]
    tensors = memory.local_tensors(folder)
    assert memory.model_bytes(tensors) == data_bytes(folder)
    assert memory.param_count(tensors) == memory.param_count(memory.estimate_from_config(memory.read_config(folder)))
    assert memory.check_pair_fits(folder, hub.dirs[D]).fits
    with pytest.raises(MlxspecError, match="needs about"):
        memory.check_pair_fits(folder, hub.dirs[D], budget_bytes=100_000)


def test_catalog_counts_match_their_configs():
    assert len(catalog.PAIRS) >= 10
    for repo, (params, cfg) in catalog.MODELS.items():
        assert memory.param_count(memory.estimate_from_config(cfg)) == params, repo
    for t, d in catalog.PAIRS:
        (_, tc), (_, dc) = catalog.MODELS[t], catalog.MODELS[d]
        assert abs(tc["vocab_size"] - dc["vocab_size"]) <= 128, (t, d)
        assert catalog.MODELS[t][0] > catalog.MODELS[d][0]


def test_pairs_command_lists_fit_columns():
    res = CliRunner().invoke(pairs_cmd, ["--budget", "8"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if ln.startswith("Qwen/Qwen2.5-7B-Instruct "))
    cols = line.split()  # target, draft, params, 4-bit (2 words), fits, float32 (2 words), fits
    assert cols[1] == "Qwen/Qwen2.5-0.5B-Instruct" and cols[4] == cols[7] == "GiB"
    assert cols[5] == "yes" and cols[8] == "no"  # 4-bit fits in 8 GiB, float32 does not
    assert "meta-llama/Llama-3.1-8B-Instruct *" in res.output and "--budget 8 GiB" in res.output
