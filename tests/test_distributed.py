"""The target sharded over two ranks on loopback (`mlx.launch --backend ring -n 2`, issue 62):
real processes, real tiny models (qwen2, 4 heads / 2 key-value heads, split tensor parallel).

* tests/distributed_ranks.py, one launch: greedy chains and trees, and seeded (coupled)
  sampling with chains and trees, each token for token the single-process plain run of the
  same target; then rank 1 vanishes and rank 0's next target pass ends in one line naming it.
* the `mlxspec generate` command under mlx.launch, split by layers (--pipeline): only rank 0
  prints, one JSON object, whose tokens are the single-process plain greedy tokens; the header
  names the split.
* in-process: a model class without the sharding asked for is refused naming the class;
  heads that do not divide; each rank's memory check budgets its share, not the whole.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

import mlxspec
import tiny_models
from mlxspec.distributed.memory import check_rank_fits, rank_share
from mlxspec.distributed.sharding import Sharding
from mlxspec.errors import MlxspecError
from mlxspec.models.memory import check_pair_fits, local_tensors, model_bytes

HERE = Path(__file__).parent
LAUNCH = shutil.which("mlx.launch", path=str(Path(sys.executable).parent)) or shutil.which("mlx.launch")
needs_launch = pytest.mark.skipif(LAUNCH is None or not mx.distributed.is_available("ring"),
                                  reason="mlx.launch or MLX's ring backend is not available")


def launch(*command, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_RANK", "MLX_HOSTFILE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(HERE), env.get("PYTHONPATH", "")])
    return subprocess.run([LAUNCH, "--backend", "ring", "-n", "2", "--", sys.executable, *command],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE.parent)


def json_lines(text):
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]


@needs_launch
def test_two_ranks_equal_the_single_process_run_and_a_vanished_rank_ends_it(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    res = launch(str(HERE / "distributed_ranks.py"), str(t), str(d), "exit")
    reports = json_lines(res.stdout)
    assert len(reports) == 1, res.stdout + res.stderr  # rank 0 alone prints
    r = reports[0]
    assert (r["rank"], r["size"], r["mode"]) == (0, 2, "tensor parallel over 2 ranks")
    assert 0 < r["target_bytes_held"] < 0.8 * r["target_bytes_whole"], r  # rank 0 holds its share of the target
    for case in ("greedy_chain", "greedy_tree", "seeded_chain", "seeded_tree"):
        c = r[case]
        assert c["mirrored"] == "MirroredState", case  # the target's passes ran on both ranks
        assert c["n"] == 24 and c["sharded"] == c["plain"], (case, c)
        assert c["accepted"] > 0, case  # the draft's tokens were kept: speculation ran
    for case in ("greedy_tree", "seeded_tree"):
        assert r[case]["tree_nodes"] > r[case]["tree_depth"], r[case]  # real trees: siblings were verified
    assert r["seeded_chain"]["plain"] != r["greedy_chain"]["plain"]  # the seed sampled
    assert r["failure"].startswith("rank 0: lost the connection to rank 1"), r["failure"]
    assert r["failure_after_s"] < 10
    assert 0 < r["messages"]["messages"] and 0 < r["messages"]["bytes"] <= 256 * r["messages"]["messages"]


@needs_launch
def test_generate_command_with_pipeline_prints_on_rank_0_only(tiny_pair_dirs, tmp_path):
    t, d = tiny_pair_dirs
    args = ["--model", str(t), "--draft", str(d), "-p", "w1 w2 w3 w1 w2", "--ignore-chat-template",
            "--max-tokens", "20", "--num-draft", "3", "--json", "--pipeline"]
    res = launch("-m", "mlxspec.cli", "generate", *args)
    outs = json_lines(res.stdout)
    assert len(outs) == 1, res.stdout + res.stderr
    assert "pipeline parallel over 2 ranks" in outs[0]["pair"]
    whole = mlxspec.load(t, d)
    plain = mlxspec.generate(whole, "w1 w2 w3 w1 w2", max_tokens=20, num_draft=0, chat_template=False).tokens
    assert outs[0]["tokens"] == plain
    assert outs[0]["stats"]["draft_accepted"] > 0


def _sharding(rank, size, pipeline):
    s = Sharding.__new__(Sharding)  # no group: only the checks before mlx-lm's own split are exercised
    s.group, s.pipeline, s.rank, s.size, s.leader = None, pipeline, rank, size, None
    return s


def test_refusals_name_the_model_class(tmp_path):
    llama = tiny_models.make_model("llama")
    with pytest.raises(MlxspecError, match=r"llama\.Model has no pipeline sharding"):
        _sharding(0, 2, True).apply(llama, tiny_models.config_for("llama"))
    qwen = tiny_models.make_model("qwen2")
    with pytest.raises(MlxspecError, match=r"4 attention heads \(2 key/value heads\) do not divide among 3"):
        _sharding(0, 3, False).apply(qwen, tiny_models.config_for("qwen2"))

    class Plain:  # a class mlx-lm gives no `shard`
        pass

    with pytest.raises(MlxspecError, match=r"Plain has no tensor-parallel sharding"):
        _sharding(0, 2, False).apply(Plain(), {})


def test_each_rank_budgets_its_share(tiny_pair_dirs):
    t, d = tiny_pair_dirs
    whole = check_pair_fits(t, d, budget_bytes=1 << 40).total
    tensors = local_tensors(t)
    cfg = json.loads((Path(t) / "config.json").read_text())
    for pipeline in (False, True):
        shares = [rank_share(tensors, cfg, r, 2, pipeline)[0] for r in range(2)]
        assert model_bytes(shares[0]) < model_bytes(tensors)
        if pipeline:  # the layers are split, the rest (embeddings, norm) is on both
            assert model_bytes(shares[0]) + model_bytes(shares[1]) > model_bytes(tensors)
    share0 = check_rank_fits(t, d, 0, 2, False, budget_bytes=1 << 40).total
    share1 = check_rank_fits(t, None, 1, 2, False, budget_bytes=1 << 40).total
    assert share1 < share0 < whole
    budget = (share0 + whole) // 2  # the whole pair does not fit it; rank 0's share does
    with pytest.raises(MlxspecError, match="needs about"):
        check_pair_fits(t, d, budget_bytes=budget)
    check_rank_fits(t, d, 0, 2, False, budget_bytes=budget)
    with pytest.raises(MlxspecError, match=r"^rank 1: its share of the target needs about"):
        check_rank_fits(t, None, 1, 2, False, budget_bytes=share1 - 1)
