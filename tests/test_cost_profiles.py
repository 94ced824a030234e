"""Cost profiles (costs/profiles.py, docs/profiles.md): the format and its checks, the mapping onto
CostModel, pricing recorded rounds, the loop's round record (GenerationStats.rounds), decisions
under a profile, and `bench --profile`'s projection."""

import json

import pytest
from click.testing import CliRunner

import test_greedy_equality as ge
from cli_util import assert_refused, run_cli
from mlxspec.api import make_policy
from mlxspec.bench.projection import mlxlm_work, project
from mlxspec.bench.contenders import mlxlm_rounds
from mlxspec.core.stats import GenerationStats
from mlxspec.costs import profiles
from mlxspec.costs.draft_length import FixedK
from mlxspec.decoder import SpeculativeDecoder
from mlxspec.drafting.drafters import ModelDrafter, PromptLookupDrafter
from mlxspec.errors import MlxspecError

PROMPT = [7, 19, 200, 31, 31, 5]


def custom(**kw):
    d = {"format": profiles.FORMAT, "name": "t", "draft_step": 0.2, "verify": {"2": 1.1, "3": 1.2, "4": 1.3},
         "draft_widths": {"2": 1.5}}
    d.update(kw)
    return d


def test_shipped_profiles_load_with_sources_and_rise_with_width():
    assert set(profiles.names()) == {"apple-m3plus-7b", "apple-m3plus-32b", "apple-m3plus-1.5b", "apple-m1-7b",
                                     "this-machine"}
    assert profiles.load_profile("this-machine") is None  # the calibration
    for name in profiles.SHIPPED:
        p = profiles.load_profile(name)
        assert p.sources and p.description
        cm = p.cost_model()
        assert cm.verify[0] == 1.0 and all(b >= a for a, b in zip(cm.verify, cm.verify[1:]))
        assert 0 < cm.draft_step < 1 and len(cm.verify) == 32
    m3, m1 = profiles.profile_cost("apple-m3plus-7b"), profiles.profile_cost("apple-m1-7b")
    assert m1.verify_width(4) > 2 * m3.verify_width(4) - 1  # M1/M2: each row nearly a full weight read


def test_the_mapping_onto_the_cost_model_counts_the_host_overhead():
    p = profiles.from_dict(custom(host_overhead=0.1))
    cm = p.cost_model()
    assert cm.verify_width(2) == pytest.approx((1.1 + 0.1) / 1.1, abs=1e-4)
    assert cm.draft_step == pytest.approx(0.3 / 1.1, abs=1e-4)
    assert cm.draft_width(2) == pytest.approx((0.2 * 1.5 + 0.1) / 1.1, abs=1e-3)
    # a drafter with no draft model keeps its own step; the verify curve is the profile's
    lk = p.cost_model(PromptLookupDrafter())
    assert lk.draft_step == pytest.approx((0.01 + 0.1) / 1.1, abs=1e-4) and lk.verify == cm.verify


def test_host_time_per_position_makes_wide_passes_dearer():
    """A tree node's host work (benchmarks/host_overhead.py) is priced per position beyond a
    forward's first, in the verify curve and in the draft's forwards alike."""
    p = profiles.from_dict(custom(host_overhead=0.1, host_per_position=0.02))
    cm = p.cost_model()
    assert cm.verify_width(1) == 1.0
    assert cm.verify_width(2) == pytest.approx((1.1 + 0.1 + 0.02) / 1.1, abs=1e-4)
    assert cm.draft_width(2) == pytest.approx((0.2 * 1.5 + 0.1 + 0.02) / 1.1, abs=1e-3)
    base = profiles.from_dict(custom(host_overhead=0.1)).cost_model()
    assert cm.verify_width(16) - base.verify_width(16) == pytest.approx(15 * 0.02 / 1.1, abs=1e-3)
    for name in profiles.SHIPPED:  # each shipped profile's share is the measured host time over its step
        d = profiles.SHIPPED[name]
        assert d["host_per_position"] == pytest.approx(profiles.HOST_MS["position"] / d["target_step_ms"], abs=1e-4)
        assert profiles.load_profile(name).to_dict()["target_step_ms"] == d["target_step_ms"]


def test_pricing_a_known_rounds_list():
    cm = profiles.from_dict(custom()).cost_model()
    rounds = [((1, 1, 1), 4, 3), ((2, 1), 3, 2), ((), 1, 1)]
    # 3 x 0.2 + 1.3;  0.2 x 1.5 + 0.2 + 1.2;  1
    assert profiles.price(rounds, cm) == (6, pytest.approx(4.6))
    assert profiles.projected_speedup(rounds, cm) == pytest.approx(6 / 4.6)
    as_json = [{"draft_widths": list(d), "verify_width": v, "emitted": e} for d, v, e in rounds]
    assert profiles.projected_speedup(as_json, cm) == pytest.approx(6 / 4.6)
    assert profiles.projected_speedup([((), 1, 1)] * 9, cm) == 1.0  # plain decoding


@pytest.mark.parametrize("content, needle", [
    ("{not json", "cost profile"),
    (json.dumps([1, 2]), "not a cost profile"),
    (json.dumps(custom(format="mlxspec-cost-profile/9")), "format"),
    (json.dumps(custom(draft_step=-1)), "draft_step"),
    (json.dumps(custom(draft_step=1e9)), "draft_step"),
    (json.dumps(custom(verify={"2": float("inf")})), "cost profile"),
    (json.dumps(custom(verify={"0": 1.0, "2": 1.1})), "width"),
    (json.dumps(custom(verify={"1": 2.0, "2": 3.0})), "verify[1]"),
    (json.dumps(custom(verify={"1": 1.0})), "above 1"),
    (json.dumps(custom(verify={str(w): 1.0 + w for w in range(1, 90)})), "verify"),
    (json.dumps(custom(host_overhead="a lot")), "host_overhead"),
    (json.dumps(custom(host_per_position=-0.01)), "host_per_position"),
    (json.dumps(custom(host_per_position=True)), "host_per_position"),
    (json.dumps(custom(target_step_ms=0)), "target_step_ms"),
    (json.dumps(custom(target_step_ms="10 ms")), "target_step_ms"),
    (json.dumps(custom(verfy={"2": 1.1})), "unknown key"),
    ("[" * 100000, "cost profile"),
])
def test_bad_profile_files_are_refused_in_one_line(tmp_path, content, needle):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(MlxspecError) as e:
        profiles.load_profile(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_name_lists_the_profiles():
    with pytest.raises(MlxspecError, match="apple-m3plus-7b.*this-machine"):
        profiles.load_profile("apple-m9")


def test_mlxlm_work_follows_its_rounds():
    flags = [True, True, True, False, True, False, False, True]
    assert mlxlm_rounds(flags, 3, 32) == [(3, 3), (3, 1), (3, 0), (3, 1)]
    # after a round that kept every draft, its last draft is fed with the next round's first forward
    assert mlxlm_work(flags, 3, 32) == [((1, 1, 1), 4, 4), ((2, 1, 1), 4, 2), ((1, 1, 1), 4, 1), ((1, 1, 1), 4, 1)]
    assert mlxlm_work([True, False], 3, 2) == [((1, 1), 3, 2)]  # the last round drafts what is left


def _generate(decoder, record=True, max_tokens=40):
    stats = GenerationStats()
    if record:
        stats.rounds = []
    out = [t for t, _ in decoder.generate(list(PROMPT), max_tokens=max_tokens, stats=stats)]
    return out, stats


@pytest.mark.parametrize("tree", [None, False])
def test_the_loop_records_every_rounds_work_and_changes_nothing(tree):
    target, drafts = ge.models("llama")
    cm = profiles.profile_cost("apple-m3plus-7b")

    def decoder():
        d = ModelDrafter(drafts[1])
        return SpeculativeDecoder(target, d, make_policy("auto", d, cost=cm), tree=tree)

    dec = decoder()
    out, stats = _generate(dec, max_tokens=ge.MAX_TOKENS)
    assert out == _generate(decoder(), record=False, max_tokens=ge.MAX_TOKENS)[0] == ge.plain(target, PROMPT)
    rounds = stats.rounds
    assert len(rounds) == stats.target_passes and sum(e for _, _, e in rounds) == stats.generated_tokens == len(out)
    assert any(dw for dw, _, _ in rounds)  # it drafted
    for (dw, v, e), k in zip(rounds, stats.k_history):
        assert v >= 1 + (k if tree is False else 0) and e <= v and all(w >= 1 for w in dw)
    assert sum(v for _, v, _ in rounds) == dec.target.positions - len(PROMPT) + 1  # every target position, prefill aside
    assert dec.target.widths is None and dec.drafter.state.widths is None  # nothing recorded after the generation
    d = stats.to_dict()["rounds"]
    assert d[0].keys() == {"draft_widths", "verify_width", "emitted"} and len(d) == len(rounds)
    assert GenerationStats().to_dict()["rounds"] is None  # off by default


def test_a_plain_step_is_recorded_as_one():
    target, _ = ge.models("llama")
    out, stats = _generate(SpeculativeDecoder(target, None, FixedK(0)), max_tokens=5)
    assert stats.rounds == [((), 1, 1)] * 5


def test_auto_falls_back_on_steep_widths_and_drafts_where_width_is_cheap():
    """apple-m1-7b: a verify position costs most of a plain step, so even a draft kept 80 % of the time
    (here, under the other profiles) does not pay: plain decoding, but for the probes; apple-m3plus-32b:
    a 32B target's extra positions and a 0.5B draft cost little, so every round drafts."""
    target, drafts = ge.models("llama")
    runs = {}
    for name in ("apple-m1-7b", "apple-m3plus-32b"):
        d = ModelDrafter(drafts[0])
        dec = SpeculativeDecoder(target, d, make_policy("auto", d, cost_profile=name))
        runs[name] = _generate(dec, max_tokens=48)[1]
    m1, m3 = runs["apple-m1-7b"], runs["apple-m3plus-32b"]
    assert any(n.startswith("fallback") for n in m1.notes)
    verified = [r for r in m1.rounds if r[1] > 1]
    assert len(verified) <= 3 and m1.tokens_plain >= 40  # only the probes verify drafts
    assert all(dw == () for dw, _, _ in m1.rounds[-20:])  # and between probes not even a draft forward
    assert all(v > 1 for _, v, _ in m3.rounds) and m3.acceptance_rate > 0.7 and m3.tokens_per_pass > 2
    cm = profiles.profile_cost("apple-m3plus-32b")
    assert profiles.projected_speedup(m3.rounds, cm) > 1.5
    assert profiles.projected_speedup(m1.rounds, profiles.profile_cost("apple-m1-7b")) < 1.0  # the probes cost


def test_generate_json_carries_the_rounds_and_refuses_a_bad_profile(tiny_pair_dirs, tmp_path):
    target, draft = tiny_pair_dirs
    res = run_cli(tmp_path, "generate", "--model", str(target), "--draft", str(draft), "-p", "the cat sat",
                  "-m", "12", "--json", "--cost-profile", "apple-m3plus-32b")
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout)["stats"]
    assert sum(r["emitted"] for r in stats["rounds"]) == stats["generated_tokens"] == 12
    assert len(stats["rounds"]) == stats["target_passes"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(custom(draft_step=-0.5)))
    res = run_cli(tmp_path, "generate", "--model", str(target), "-p", "x", "--cost-profile", str(bad))
    assert_refused(res, "draft_step", exit_code=2)


def test_bench_profile_prints_projected_beside_measured(tiny_pair_dirs, tmp_path):
    target, draft = tiny_pair_dirs
    suite = tmp_path / "mini.json"
    suite.write_text(json.dumps({"name": "mini", "description": "one", "prompts": [
        {"id": "one", "prompt": "the cat sat on the mat and the cat"}]}))
    out = tmp_path / "out"
    result = CliRunner().invoke(__import__("mlxspec.commands.bench", fromlist=["bench"]).bench, [
        "--model", str(target), "--draft", str(draft), "--suite", str(suite), "--prompts", "1",
        "--max-tokens", "10", "--contenders", "plain,mlx-lm,model:auto", "--profile", "apple-m3plus-32b",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "projected (apple-m3plus-32b)" in result.stdout
    doc = json.loads((out / "results.json").read_text())
    rows = {r["contender"]: r["projected_speedup"] for r in doc["projection"]["rows"]}
    assert rows["plain"] == 1.0 and rows["mlx-lm k=3"] > 1 and rows["mlxspec model auto"] > 1
    assert "profile apple-m3plus-32b" in doc["projection"]["costs"]["mlxspec model auto"]
    # the projection re-derived from the records
    recs = doc["runs"]
    again = project(recs, doc["contenders"], {c: profiles.profile_cost("apple-m3plus-32b") for c in rows}, 10)
    assert {r["contender"]: r["projected_speedup"] for r in again}["mlx-lm k=3"] == rows["mlx-lm k=3"]


def test_a_projection_leaves_out_the_first_rounds_tokens_as_the_measured_rate_does():
    cm = profiles.from_dict(custom()).cost_model()
    # the first round emitted 3 tokens with the prompt; the rest: two rounds (price 4.6 - 1.9)
    rec = {"contender": "c", "temp": 0.0, "suite": "s", "prompt": "p", "first_round_tokens": 3,
           "mlxspec_stats": {"rounds": [((1, 1, 1), 4, 3), ((2, 1), 3, 2), ((), 1, 1)]}}
    rows = project([rec], [{"name": "c", "kind": "mlxspec"}], {"c": cm}, 10)
    assert rows[0]["projected_speedup"] == pytest.approx(3 / (4.6 - 1.9))  # with the first round: 6 / 4.6


def test_mlx_lm_is_priced_by_the_whole_heads_draft_and_mlxspec_by_its_pruned_one(monkeypatch):
    """mlx-lm drafts with the draft model's whole head, dearer than mlxspec's pruned head:
    under this-machine each contender's draft is priced by its own drafter's calibration."""
    import mlxspec.api
    from mlxspec.bench.contenders import make_contender
    from mlxspec.commands import bench as bench_cmd
    from mlxspec.costs import calibration, cost_model

    asked = []
    monkeypatch.setattr(mlxspec.api, "make_drafter", lambda pair, kind, draft_vocab=None: asked.append(draft_vocab)
                        or draft_vocab)
    monkeypatch.setattr(calibration, "for_decoder", lambda pair, d: cost_model.assumed(0.4 if d == "full" else 0.2))
    pair = type("Pair", (), {"draft": object()})()
    lineup = [make_contender("mlx-lm"), make_contender("model:3")]
    rec = {"temp": 0.0, "suite": "s", "prompt": "p", "first_round_tokens": 1, "tokens": [1] * 4,
           "from_draft": [False, True, True, False], "finish_reason": "length"}
    runs = [dict(rec, contender="mlx-lm k=3"),
            dict(rec, contender="mlxspec model k=3", mlxspec_stats={"rounds": [((), 1, 1), ((1, 1, 1), 4, 3)]})]
    doc = bench_cmd._projection(pair, lineup, {"runs": runs, "contenders": [c.describe() for c in lineup]},
                                None, 4)
    assert sorted(asked, key=str) == [None, "full"]
    assert "draft step 0.40" in doc["costs"]["mlx-lm k=3"] and "draft step 0.20" in doc["costs"]["mlxspec model k=3"]
