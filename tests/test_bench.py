"""`mlxspec bench` on tiny models: suites, figures, the JSON, the greedy check, --quick."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxspec.commands import bench
from mlxspec.errors import MlxspecError

SUITES_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "suites"

RUN_FIELDS = {
    "contender", "suite", "prompt", "prompt_tokens", "temp", "repeat", "seed", "generated_tokens",
    "first_round_tokens", "first_round_time", "decode_tokens", "decode_time", "decode_tps", "total_time", "e2e_tps",
    "proposed", "accepted", "acceptance_rate", "target_passes", "mean_accepted_length", "proposed_by_position",
    "accepted_by_position", "peak_memory_bytes", "finish_reason", "tokens", "from_draft", "token_times",
    "matches_plain", "first_divergence",
}
SUMMARY_FIELDS = {
    "temp", "suite", "contender", "prompts", "runs", "tokens_per_s", "e2e_tokens_per_s", "speedup",
    "speedup_per_prompt", "e2e_speedup", "acceptance_rate", "draft_proposed", "draft_accepted", "mean_accepted_length",
    "draft_token_share", "generated_tokens", "peak_memory_bytes", "greedy_match", "tree_nodes_per_round",
    "tree_depth_per_round", "near_ties",
}
DOC_FIELDS = {
    "schema", "command", "date", "machine", "load_average_start", "versions", "pair", "config", "contenders",
    "skipped", "prompts", "warmup", "runs", "summary", "elapsed_s", "outputs",
}
MACHINE_FIELDS = {"backend", "platform", "machine", "python", "cpu_count", "memory_bytes", "load_average"}


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    doc = {"name": "mini", "description": "two short prompts", "prompts": [
        {"id": "one", "prompt": "the cat sat on the mat and the cat"},
        {"id": "two", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]},
    ]}
    path = tmp_path_factory.mktemp("suite") / "mini.json"
    path.write_text(json.dumps(doc))
    return path


# ---- suites ------------------------------------------------------------------------------


def test_shipped_suites_are_valid_and_found_by_name():
    for name in bench.DEFAULT_SUITES:
        suite = bench.load_suite(name)
        assert suite.name == name and 3 <= len(suite.prompts) <= 5
        assert Path(suite.path).resolve().parent == SUITES_DIR
        assert all(p.messages[-1]["role"] == "user" and p.messages[-1]["content"] for p in suite.prompts)
    # input-grounded prompts carry a long input to copy from
    grounded = bench.load_suite("grounded")
    assert min(len(p.messages[-1]["content"]) for p in grounded.prompts) > 400


def test_suite_validation_and_selection(suite_file):
    with pytest.raises(MlxspecError, match="prompts"):
        bench.parse_suite({"name": "x", "prompts": []})
    with pytest.raises(MlxspecError, match="duplicate"):
        bench.parse_suite({"name": "x", "prompts": [{"id": "a", "prompt": "p"}, {"id": "a", "prompt": "q"}]})
    with pytest.raises(MlxspecError, match="needs 'prompt'"):
        bench.parse_suite({"name": "x", "prompts": [{"id": "a"}]})
    with pytest.raises(MlxspecError, match="unknown suite"):
        bench.load_suite("no-such-suite")
    mini = bench.load_suite(str(suite_file))
    assert [p.key for p in bench.select_prompts([mini], 1)] == ["mini/one"]
    assert len(bench.select_prompts([mini], 0)) == 2
    assert mini.prompts[1].messages[0] == {"role": "system", "content": "be brief"}


# ---- pure figures ------------------------------------------------------------------------


def test_speedup_is_pairwise_per_prompt_then_median():
    base = {"p1": [1.0], "p2": [2.0], "p3": [10.0]}
    mine = {"p1": [1.5], "p2": [10.0], "p3": [11.0]}
    speedup, ratios = bench.pairwise_speedup(mine, base)
    assert ratios == pytest.approx({"p1": 1.5, "p2": 5.0, "p3": 1.1})
    assert speedup == pytest.approx(1.5)  # not 10/2 (ratio of medians) nor 22.5/13 (ratio of sums)
    # repeats: the median per prompt first (an outlier repeat does not move it)
    speedup, ratios = bench.pairwise_speedup({"p1": [2.0, 2.2, 100.0]}, {"p1": [1.0, 1.1, 0.9]})
    assert ratios["p1"] == pytest.approx(2.2) and speedup == pytest.approx(2.2)
    # a prompt the baseline lacks is left out
    assert bench.pairwise_speedup({"p1": [2.0], "px": [9.0]}, {"p1": [1.0]})[1] == {"p1": 2.0}


def _rec(contender, prompt, tps, temp=0.0, tokens=(1, 2, 3), repeat=0, proposed=0, accepted=0, passes=3):
    return {"contender": contender, "suite": prompt.split("/")[0], "prompt": prompt, "temp": temp, "repeat": repeat,
            "decode_tps": tps, "e2e_tps": tps / 2, "proposed": proposed, "accepted": accepted,
            "target_passes": passes, "generated_tokens": len(tokens), "tokens": list(tokens),
            "from_draft": [False] * len(tokens), "peak_memory_bytes": 1000, "matches_plain": None}


def test_summary_from_synthetic_timings():
    recs = [
        _rec("plain", "s/p1", 1.0), _rec("plain", "s/p2", 2.0), _rec("plain", "t/p3", 10.0),
        _rec("fast", "s/p1", 1.5, proposed=6, accepted=3, passes=2),
        _rec("fast", "s/p2", 10.0, proposed=6, accepted=6, passes=1, tokens=(1, 2, 4)),
        _rec("fast", "t/p3", 11.0, proposed=6, accepted=0, passes=3),
    ]
    bench.check_greedy(recs)
    rows = {(r["suite"], r["contender"]): r for r in bench.summarize(recs, ["plain", "fast"])}
    assert set(rows) == {(s, c) for s in ("s", "t", "all") for c in ("plain", "fast")}
    fast = rows[("all", "fast")]
    assert set(fast) == SUMMARY_FIELDS
    assert fast["speedup"] == pytest.approx(1.5)  # median of 1.5, 5, 1.1
    assert fast["speedup_per_prompt"] == pytest.approx({"s/p1": 1.5, "s/p2": 5.0, "t/p3": 1.1})
    assert fast["tokens_per_s"] == pytest.approx(10.0)
    assert fast["acceptance_rate"] == pytest.approx(9 / 18)  # pooled, not a mean of rates
    assert fast["mean_accepted_length"] == pytest.approx(9 / 6)
    assert fast["greedy_match"] == {"matched": 2, "checked": 3}
    assert rows[("s", "fast")]["speedup"] == pytest.approx((1.5 + 5.0) / 2)
    assert rows[("t", "fast")]["greedy_match"] == {"matched": 1, "checked": 1}
    assert rows[("all", "plain")]["speedup"] == pytest.approx(1.0)
    assert rows[("all", "plain")]["acceptance_rate"] is None


def test_first_round_is_excluded_from_the_decode_rate():
    # a speculative first round: 2 drafts + the target token at t=1.0, then one token each 0.5 s
    times = [1.0, 1.0, 1.0, 1.5, 2.0, 2.5]
    t = bench.timing_figures(times, [True, True, False, False, False, False], total_time=2.6)
    assert t["first_round_tokens"] == 3 and t["decode_tokens"] == 3
    assert t["decode_tps"] == pytest.approx(2.0)
    assert t["e2e_tps"] == pytest.approx(6 / 2.6)
    plain = bench.timing_figures([1.0, 1.5, 2.0], [False] * 3, total_time=2.0)
    assert plain["first_round_tokens"] == 1 and plain["decode_tps"] == pytest.approx(2.0)


def test_mlxlm_rounds_rebuilt_from_flags():
    flags = [True, True, False, False, True, True, True, False, True, True]
    rounds = bench.mlxlm_rounds(flags, k=3, max_tokens=10)
    assert rounds == [(3, 2), (3, 0), (3, 3), (2, 2)]  # the last round drafts only what max_tokens leaves
    assert bench.position_counts(rounds) == ([4, 4, 3], [3, 3, 1])


def test_predicted_speedup_formula():
    assert bench.expected_tokens_geometric(0.5, 2) == pytest.approx(1.75)
    assert bench.expected_tokens_geometric(1.0, 3) == 4.0
    assert bench.expected_tokens([0.8, 0.6, 0.3], 2) == pytest.approx(2.4)
    assert bench.per_token_acceptance([10, 8], [8, 4]) == pytest.approx(12 / 18)
    rows = bench.predict([1.0, 1.0, 1.0], 1.0, 0.0, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0})
    assert [r["speedup"] for r in rows] == pytest.approx([2.0, 3.0, 4.0])
    assert bench.recommend(rows) == {"k": 3, "best_k": 3, "speedup": 4.0, "pays": True}
    slow = bench.predict([0.2, 0.1], 0.16, 0.5, {0: 1.0, 1: 1.1, 2: 1.2})
    assert bench.recommend(slow)["pays"] is False and bench.recommend(slow)["k"] == 0


def test_contender_specs(tiny_pair):
    names = [c.name for c in bench.make_contenders("model:auto,lookup:5,mlx-lm:2", 3)]
    assert names == ["plain", "mlxspec model auto", "mlxspec lookup k=5", "mlx-lm k=2"]  # plain always added
    assert len(bench.make_contenders("all")) >= 8
    for bad in ("magic", "model:0", "mlx-lm:auto", "model:x"):
        with pytest.raises(MlxspecError):
            bench.make_contender(bad)
    no_draft = dataclasses.replace(tiny_pair, draft=None)
    assert "no draft" in bench.make_contender("model").unavailable(no_draft)
    assert "no draft" in bench.make_contender("mlx-lm").unavailable(no_draft)
    assert bench.make_contender("plain").unavailable(no_draft) is None
    assert bench.make_contender("model").unavailable(tiny_pair) is None


# ---- the runner on the tiny pair ------------------------------------------------------------


class OffByOne(bench.MlxspecContender):
    """A deliberately wrong contender: the model drafter, but its 4th token is replaced."""

    def stream(self, pair, ids, temp, max_tokens, seed, info):
        for i, (tok, fd) in enumerate(super().stream(pair, ids, temp, max_tokens, seed, info)):
            yield ((tok + 1) % 300 if i == 3 else tok), fd


def test_greedy_check_catches_a_wrong_contender(tiny_pair, suite_file):
    prompts = bench.load_suite(str(suite_file)).prompts
    lineup = [bench.make_contender("plain"), bench.make_contender("model:3"), OffByOne("off-by-one", "model", 3)]
    res = bench.run_benchmark(tiny_pair, prompts, lineup, temps=[0.0], max_tokens=10, echo=lambda s: None)
    runs = {(r["contender"], r["prompt"]): r for r in res["runs"]}
    for p in prompts:
        good, bad = runs[("mlxspec model k=3", p.key)], runs[("off-by-one", p.key)]
        assert good["matches_plain"] is True and good["first_divergence"] is None
        assert bad["matches_plain"] is False and bad["first_divergence"] == 3
        assert bad["near_tie_gap"] > 0  # the target's logit gap between the two tokens is reported
    rows = {r["contender"]: r for r in res["summary"] if r["suite"] == "mini"}
    assert rows["off-by-one"]["greedy_match"] == {"matched": 0, "checked": 2}
    assert rows["mlxspec model k=3"]["greedy_match"] == {"matched": 2, "checked": 2}
    assert rows["plain"]["speedup"] == pytest.approx(1.0)


def test_cli_writes_json_markdown_and_chart(tiny_pair_dirs, suite_file, tmp_path):
    target, draft = tiny_pair_dirs
    out = tmp_path / "out"
    result = CliRunner().invoke(bench.bench, [
        "--model", str(target), "--draft", str(draft), "--suite", f"{suite_file},chat", "--prompts", "2",
        "--max-tokens", "10", "--temps", "0,0.7", "--contenders", "plain,mlx-lm,model,lookup:auto",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "speed-up" in result.stdout and "mlx-lm k=3" in result.stdout and "mlxspec model k=3" in result.stdout
    doc = json.loads((out / "results.json").read_text())
    assert DOC_FIELDS <= set(doc)
    assert MACHINE_FIELDS <= set(doc["machine"]) and doc["machine"]["backend"].startswith("MLX")
    assert {"mlx", "mlx-lm", "mlxspec"} <= set(doc["versions"]) and doc["versions"]["mlx"]
    assert doc["config"]["temps"] == [0.0, 0.7] and doc["config"]["max_tokens"] == 10
    names = {c["name"] for c in doc["contenders"]}
    assert {"plain", "mlx-lm k=3", "mlxspec model k=3"} <= names
    assert len(doc["prompts"]) == 4  # mini: 2, chat: first 2
    assert len(doc["runs"]) == len(names) * 4 * 2
    for r in doc["runs"]:
        assert RUN_FIELDS <= set(r)
        assert r["generated_tokens"] == len(r["tokens"]) == len(r["from_draft"]) == len(r["token_times"]) > 0
        assert r["decode_tps"] > 0 and r["peak_memory_bytes"] > 0
        if r["contender"] not in ("plain", "mlx-lm plain"):
            # prompt lookup may find no n-gram in 10 tokens of random text: it proposes nothing then
            assert (r["proposed"] > 0 or "lookup" in r["contender"]) and 0 <= r["accepted"] <= r["proposed"]
            assert r["accepted"] == sum(r["accepted_by_position"])
        if r["contender"].startswith("mlx-lm"):
            assert r["accepted"] == sum(r["from_draft"])
        assert (r["matches_plain"] is None) == (r["temp"] != 0)
    for row in doc["summary"]:
        assert SUMMARY_FIELDS <= set(row)
    greedy_model = [r for r in doc["runs"] if r["contender"] == "mlxspec model k=3" and r["temp"] == 0]
    assert all(r["matches_plain"] for r in greedy_model)  # lossless
    md = (out / "summary.md").read_text()
    assert "| suite | contender |" in md and doc["command"] in md
    try:
        import matplotlib  # noqa: F401

        assert (out / "chart.png").stat().st_size > 1000 and doc["outputs"]["png"].endswith("chart.png")
    except ImportError:
        assert "no chart" in result.output


def test_quick_prints_a_recommendation(tiny_pair_dirs, suite_file, tmp_path):
    target, draft = tiny_pair_dirs
    result = CliRunner().invoke(bench.bench, [
        "--model", str(target), "--draft", str(draft), "--suite", str(suite_file), "--quick", "--max-tokens", "8",
        "--max-k", "3", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Will it pay?" in result.stdout and "Recommended: " in result.stdout
    assert "predicted speed-up" in result.stdout and "cost ratio c" in result.stdout
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert [r["k"] for r in doc["predictions"]] == [1, 2, 3]
    assert set(doc["verify_ratio"]) == {"0", "1", "2", "3"}
    assert 0 <= doc["acceptance_rate"] <= 1 and doc["cost_ratio_c"] > 0
    assert doc["recommendation"]["k"] in (0, 1, 2, 3)
    assert doc["cost_model"]["source"] in ("measured", "cached")  # the pair's calibration, not its own timing
    assert doc["auto"]["k"] in (0, 1, 2, 3)


def test_quick_needs_a_draft(tiny_pair_dirs, suite_file):
    target, _ = tiny_pair_dirs
    result = CliRunner().invoke(bench.bench, ["--model", str(target), "--suite", str(suite_file), "--quick"])
    assert isinstance(result.exception, MlxspecError) and "--draft MODEL" in str(result.exception)
    assert "--no-draft" not in str(result.exception)  # not given, so not mentioned


# ---- --quick follows the calibrated cost model and the per-token policy's rule ----------------


def test_quick_advice_follows_the_cost_model_and_the_per_token_rule(tiny_pair_dirs, suite_file, monkeypatch):
    """A controlled cost ratio: the draft is the target itself (its greedy drafts are kept;
    its weights not rounded to int8) and the costs are given, so the advice is decided by them alone."""
    import mlxspec
    from mlxspec.cpu import draft_weights
    from mlxspec.costs.cost_model import CostModel

    monkeypatch.setenv(draft_weights.ENV, "0")

    target, _ = tiny_pair_dirs
    pair = mlxspec.load(target, target)
    prompts = bench.load_suite(str(suite_file)).prompts
    cheap = CostModel(0.05, [1.0, 1.05, 1.1, 1.15, 1.2], source="given")
    adv = bench.advise(pair, prompts, max_tokens=12, max_k=4, cost=cheap, echo=lambda s: None)
    assert min(adv["acceptance_by_position"]) > 0.9
    assert adv["cost_ratio_c"] == 0.05 and adv["verify_ratio"]["4"] == pytest.approx(1.2)
    rows = {r["k"]: r for r in adv["predictions"]}
    assert rows[4]["cost"] == pytest.approx(4 * 0.05 + 1.2)
    assert adv["recommendation"]["pays"] and adv["recommendation"]["k"] == 4
    # the policy's own rule drafts to the cap here, and its prediction is the table's
    assert adv["auto"]["k"] == 4 and adv["auto"]["speedup"] == pytest.approx(rows[4]["speedup"])
    assert "Recommended: the default, --num-draft auto" in bench.format_advice(adv, "pair")

    dear = CostModel(1.2, [1.0, 1.5, 2.0, 2.5, 3.0], source="given")  # a draft step dearer than a target step
    adv = bench.advise(pair, prompts, max_tokens=12, max_k=4, cost=dear, echo=lambda s: None)
    assert not adv["recommendation"]["pays"] and adv["auto"]["k"] == 0
    text = bench.format_advice(adv, "pair")
    assert "falls back to plain decoding" in text and "Recommended: --no-draft" in text


def test_policy_round_stops_where_the_rate_peaks():
    from mlxspec.costs.cost_model import CostModel

    flat = CostModel(0.2, [1.0] * 8)
    # acceptance falls with position: 0.9, then 0.9*0.5, then 0.9*0.5*0.1 (cumulative)
    acc = [0.9, 0.45, 0.045, 0.0045]
    got = bench.policy_round(acc, flat, 4)
    rows = bench.predict(acc, 0.5, 0.2, {k: 1.0 for k in range(5)})
    best = max(rows, key=lambda r: r["speedup"])
    assert got["k"] == best["k"] == 2 and got["speedup"] == pytest.approx(best["speedup"])


# ---- --quick agrees with what bench then measures -----------------------------------------------


@pytest.fixture(scope="module")
def middling_pair_dirs(tmp_path_factory):
    """A tiny qwen2 target and a draft that agrees with it often, not always."""
    import tiny_models

    root = tmp_path_factory.mktemp("middling")
    cfg = tiny_models.config_for("qwen2")
    target = tiny_models.build(cfg, seed=0, scale=3.0)
    draft = tiny_models.perturbed(target, cfg, noise=MIDDLING_NOISE, seed=1)
    return (tiny_models.save_model_dir(root / "target", "qwen2", model=target),
            tiny_models.save_model_dir(root / "draft", "qwen2", model=draft))


MIDDLING_NOISE = 0.03  # acceptance about 0.4 on these prompts


def test_quick_predicts_the_tokens_per_pass_that_bench_measures(middling_pair_dirs, suite_file, tmp_path):
    """`bench --quick` at its defaults predicts, per fixed k, the tokens per target pass
    that `bench` then measures for that k (greedy: counts, not clocks; the cost half of
    the prediction is the calibrated cost model, tested above).  With 16 tokens of one
    prompt per suite (its old defaults) the acceptance by position came from a handful
    of rounds and missed by up to a third."""
    import mlxspec
    from mlxspec.bench.contenders import MlxspecContender

    target, draft = middling_pair_dirs
    result = CliRunner().invoke(bench.bench, ["--model", str(target), "--draft", str(draft), "--suite",
                                              str(suite_file), "--quick", "--max-k", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert 0.3 < doc["acceptance_rate"] < 0.9, doc["acceptance_rate"]  # else any prediction would do
    pair = mlxspec.load(target, draft)
    prompts = bench.select_prompts([bench.load_suite(str(suite_file))], bench.QUICK_PROMPTS)  # the ones --quick ran
    for row in doc["predictions"]:
        contender = MlxspecContender(f"k={row['k']}", "model", row["k"])
        tokens = passes = 0
        for p in prompts:
            s = contender.run(pair, bench.encode(pair.tokenizer, p), temp=0.0, max_tokens=bench.DEFAULT_MAX_TOKENS,
                              seed=0).stats
            tokens, passes = tokens + s["generated_tokens"], passes + s["target_passes"]
        assert row["expected_tokens"] == pytest.approx(tokens / passes, rel=0.2), (row["k"], tokens / passes)


def test_quick_judges_every_draft_position_in_enough_rounds(tiny_pair_dirs, suite_file, tmp_path):
    """--quick's acceptance by position is a mean over its rounds: at its defaults each
    position must be judged in enough of them.  16 tokens (the old default) made 3-4
    rounds at k = 4 on a draft that is usually right: on the default pair that predicted
    3.5 tokens per pass for k = 4 where bench measured 4.0 on the same prompt."""
    target, draft = tiny_pair_dirs
    result = CliRunner().invoke(bench.bench, ["--model", str(target), "--draft", str(draft), "--suite",
                                              str(suite_file), "--quick", "--max-k", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "quick.json").read_text())
    assert doc["acceptance_rate"] > 0.6  # a draft that is usually right: long rounds, few of them
    assert min(doc["proposed_by_position"]) >= 8, doc["proposed_by_position"]
