"""Speculative decoding in the simulator (``SimConfig.speculative_k``, ``oasis_sim.engine``): off it changes no
output byte, a step emits 1 + accepted tokens drawn from the chain model or a recording's histogram, throughput
and transfers follow, ``auto`` runs the executor's ``oasis_core.speculation`` policy, and bad values exit 2."""

import json

import pytest
from replay_fakes import base_config, fake_results
from sim_cases import OUTPUTS, QUICK4, run_outputs

from oasis_core.recording import build_recording
from oasis_core.speculation import ChainAcceptance, position_rates
from oasis_sim.cli import main
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.replay import replay, sim_config, workload


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_off_changes_nothing_but_the_config_record(tmp_path, mode):
    base = run_outputs(tmp_path, "a", "--mode", mode)
    same = run_outputs(tmp_path, "b", "--mode", mode, "--speculative-k", "0", "--speculative-alpha", "0.3")
    for f in OUTPUTS[1:]:
        assert base[f] == same[f], f
    a, b = json.loads(base["summary.json"]), json.loads(same["summary.json"])
    assert a.pop("config")["speculative_alpha"] == 0.7 and b.pop("config")["speculative_alpha"] == 0.3
    assert a == b and "accepted_tokens_per_step" not in a


def _summary(files):
    return json.loads(files["summary.json"])


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_every_draft_accepted_emits_k_plus_one_and_raises_throughput(tmp_path, mode):
    base = _summary(run_outputs(tmp_path, "a", "--mode", mode))
    spec = _summary(run_outputs(tmp_path, "b", "--mode", mode, "--speculative-k", "3", "--speculative-alpha", "1"))
    hist = spec["accepted_hist"]
    assert set(hist["3"][:3]) == {0} and hist["3"][3] > 0  # every 3-draft step accepted all 3
    assert all(v[-1] == sum(v) for v in hist.values())  # shorter chains only at the end of a request, all accepted
    steps_full = hist["3"][3]
    assert steps_full / sum(sum(v) for v in hist.values()) > 0.9 and spec["accepted_tokens_per_step"] > 3.9
    assert spec["output_tokens"] == base["output_tokens"] and spec["steps"] < base["steps"] / 3
    # the draft head is a small share of a step (predictor's draft_step): about (k + 1) / (1 + k gamma) faster
    assert spec["throughput_tok_s"] > 2.0 * base["throughput_tok_s"]
    assert spec["tpot_ms_p50"] < base["tpot_ms_p50"] / 2
    if mode == "lookahead":  # one selection and transfer a step: fewer bytes for the same tokens
        assert spec["h2d_bytes"] < base["h2d_bytes"] / 2


def test_no_draft_accepted_costs_and_gamma_sets_the_draft_cost(tmp_path):
    base = _summary(run_outputs(tmp_path, "a", "--mode", "dense"))
    nothing = _summary(
        run_outputs(tmp_path, "b", "--mode", "dense", "--speculative-k", "3", "--speculative-alpha", "0")
    )
    assert nothing["accepted_tokens_per_step"] == 1.0 and nothing["steps"] == base["steps"]
    assert nothing["throughput_tok_s"] < base["throughput_tok_s"]
    cheap = _summary(run_outputs(tmp_path, "c", "--mode", "dense", "--speculative-k", "3", "--speculative-gamma", "0"))
    dear = _summary(run_outputs(tmp_path, "d", "--mode", "dense", "--speculative-k", "3", "--speculative-gamma", "0.5"))
    assert cheap["accepted_hist"] == dear["accepted_hist"]  # the same draws
    assert dear["throughput_tok_s"] < cheap["throughput_tok_s"] * 0.5  # 1 + 3 x 0.5 = 2.5 x the pass


def test_auto_follows_the_acceptance(tmp_path):
    hi = _summary(
        run_outputs(tmp_path, "a", "--mode", "dense", "--speculative-k", "auto:5", "--speculative-alpha", "1")
    )
    lo = _summary(
        run_outputs(tmp_path, "b", "--mode", "dense", "--speculative-k", "auto:5", "--speculative-alpha", "0")
    )
    assert max(map(int, hi["accepted_hist"])) == 5 and hi["accepted_tokens_per_step"] > 5
    n_lo = {int(k): sum(v) for k, v in lo["accepted_hist"].items()}
    assert sum(c for k, c in n_lo.items() if k <= 1) > 0.8 * sum(n_lo.values())  # backs off to short probes
    assert 0 < hi["speculative_gamma_used"] < 0.2 and lo["speculative_steps"] < lo["steps"]


def test_position_rates_reproduce_a_histogram():
    h = {"3": [40, 30, 20, 10]}
    rates, pooled = position_rates(h)
    assert rates == pytest.approx((60 / 100, 30 / 60, 10 / 30))
    assert pooled == pytest.approx((60 + 30 + 10) / (100 + 60 + 30))
    m = ChainAcceptance.from_hist(h)
    assert m.expected_tokens(3) == pytest.approx(1 + (30 + 2 * 20 + 3 * 10) / 100)  # the histogram's mean
    mixed = position_rates({"1": [5, 5], "2": [0, 0, 10]})  # censored: a 1-draft step says nothing of position 2
    assert mixed[0] == pytest.approx((15 / 20, 10 / 10))


def test_a_recordings_histogram_reaches_the_simulator():
    c = base_config(mode="dense", concurrency=2, context=2048, steps=6, warmup=1, speculative_k=3)
    rec = build_recording(c, fake_results(accepted_hist={"3": [0, 0, 0, 5]}))
    cfg = sim_config(rec)
    assert cfg.speculative_k == 3 and cfg.speculative_accepted_hist == {"3": [0, 0, 0, 5]}
    assert workload(rec).requests[0].output_tokens == (1 + 6 + 1) * 4  # as the bench: none ends in the window
    res = replay(rec)
    s = res.sim.summary
    assert s["accepted_hist"]["3"][:3] == [0, 0, 0] and s["accepted_tokens_per_step"] > 3.5
    assert res.predicted["throughput_tok_s"] == pytest.approx(
        2 * 4 * len(res.window) / sum(res.sim.steps.dur[i] for i in res.window)
    )
    none = replay(build_recording(c, fake_results(accepted_hist={"3": [5, 0, 0, 0]})))
    assert none.sim.summary["accepted_tokens_per_step"] == 1.0
    with pytest.raises(Exception, match=r"results.accepted_hist: \[\"3\"\]: must be 4 integers"):
        build_recording(c, fake_results(accepted_hist={"3": [1, 2]}))


def test_config_and_cli_errors(tmp_path, capsys):
    assert SimConfig(mode="dense", speculative_k="auto").spec_max_k == 4
    for kw, msg in (
        ({"speculative_k": "often"}, "speculative_k: must be an integer >= 0, auto or auto:N"),
        ({"mode": "quest", "speculative_k": 2}, "only modes dense and lookahead decode speculatively"),
        ({"speculative_k": 16}, r"must be < block_size \(16\)"),
        ({"speculative_alpha": 1.5}, r"speculative_alpha: must be in \[0.0, 1.0\]"),
        ({"speculative_accepted_hist": {"x": [1]}}, "speculative_accepted_hist: keys must be draft lengths"),
    ):
        with pytest.raises(ConfigError, match=msg):
            SimConfig(**kw)
    for args, msg in (
        (["--speculative-k", "junk"], "--speculative-k: must be an integer >= 0, auto or auto:N, got 'junk'"),
        (["--speculative-k", "-1"], "--speculative-k: must be an integer >= 0, got -1"),
        (["--mode", "proxy", "--speculative-k", "auto"], "only modes dense and lookahead"),
    ):
        assert main(["run", "--out", str(tmp_path / "x"), *QUICK4, *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err


def test_lookahead_speculative_step_runs_its_copies_after_the_pass(tmp_path):
    """The executor's speculative lookahead step predicts the next step's blocks after the acceptance, so its
    selection and copies run after the pass (measured on the H200 at 2610b77): more copied bytes lengthen it by
    about their copy time, where the ordinary step hides them behind its layers. Top-K 128 (QUICK's is 16): a
    layer's copies then outweigh its prediction (the top-K's ~33 µs launch and the selection), which they would
    otherwise wait behind."""
    from oasis_core.specs import get_hardware
    from oasis_sim.sim import SCATTER_EFFICIENCY

    rate = get_hardware("h100-sxm").h2d_bytes_per_s * SCATTER_EFFICIENCY  # run_outputs' default hardware
    spec = ("--speculative-k", "1", "--speculative-alpha", "0", "--speculative-gamma", "0")
    got = {}
    for fr in ("0.05", "0.5"):
        for name, extra in (("base", ()), ("spec", spec)):
            got[name, fr] = _summary(
                run_outputs(tmp_path, name + fr, "--mode", "lookahead", "--fetch-ratio", fr, "--top-k", "128", *extra)
            )
    copy_ms = {fr: 1e3 * got["base", fr]["h2d_bytes_per_step"] / rate for fr in ("0.05", "0.5")}
    more_copy = copy_ms["0.5"] - copy_ms["0.05"]
    assert more_copy > 0.2  # the larger cap moves more bytes a step
    assert abs(got["base", "0.5"]["tpot_ms_p50"] - got["base", "0.05"]["tpot_ms_p50"]) < 0.1 * more_copy  # hidden
    assert got["spec", "0.5"]["tpot_ms_p50"] - got["spec", "0.05"]["tpot_ms_p50"] > 0.8 * more_copy  # exposed


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_spec_chain_pays_the_host_round_trip_once_a_chain(tmp_path, mode):
    """``SimConfig.spec_chain`` (the executor's chained speculative steps): the calibrated predictor's host round trip
    (sparse modes; the calibration gives dense none a chain amortises) is paid once a chain, so the same draws (the
    same accepted histogram) run faster; the roofline has no host term, so it is unchanged; beside and adaptive k
    do not chain (``spec_chain_max`` 1)."""
    spec = ["--mode", mode, "--speculative-k", "1", "--speculative-alpha", "0.6"]
    one = _summary(run_outputs(tmp_path, "a", *spec, "--spec-chain", "1"))
    chained = _summary(run_outputs(tmp_path, "b", *spec))  # the default chains 8
    assert chained["accepted_hist"] == one["accepted_hist"] and chained["output_tokens"] == one["output_tokens"]
    if mode == "lookahead":
        assert chained["throughput_tok_s"] > 1.02 * one["throughput_tok_s"]
    else:
        assert chained["throughput_tok_s"] == pytest.approx(one["throughput_tok_s"], rel=1e-9)
    roof = ["--predictor", "roofline"]
    r_one = _summary(run_outputs(tmp_path, "c", *spec, *roof, "--spec-chain", "1"))
    r_chained = _summary(run_outputs(tmp_path, "d", *spec, *roof, "--spec-chain", "8"))
    assert r_chained["throughput_tok_s"] == pytest.approx(r_one["throughput_tok_s"], rel=1e-9)
    assert SimConfig(speculative_k=1).spec_chain_max == 8 and SimConfig().spec_chain_max == 1  # no k: nothing chains
    assert SimConfig(speculative_k=3, spec_chain=8).spec_chain_max == 4  # 16 // (3 + 1): one block a chain
    assert SimConfig(speculative_k="auto:2", spec_chain=8).spec_chain_max == 1
    assert SimConfig(mode="lookahead", speculative_k=1, spec_chain=8, spec_predict="beside").spec_chain_max == 1
    with pytest.raises(ConfigError):
        SimConfig(speculative_k=1, spec_chain=0)


def test_a_prediction_without_its_top_k_shortens_only_the_speculative_step(tmp_path):
    """``SimConfig.prediction_topk`` off (the executor's synthetic selection without ``synthetic_topk`` runs the
    scoring and no top-K): the ordinary lookahead step hides its prediction beside the pass, so it hardly moves; the
    speculative step runs each layer's prediction after the pass, one layer after another, so it loses about the
    top-K's time a layer (at a small cap, where each layer's prediction, not its copy, is the tail's slowest stage).
    A recording whose bench ran no top-K (``topk_kernel`` null) replays with it off."""
    from oasis_core.specs import get_model
    from oasis_sim.sim import make_predictor

    spec = ("--speculative-k", "1", "--speculative-alpha", "0", "--speculative-gamma", "0")
    got = {}
    for name, extra in (("base", ()), ("spec", spec)):
        for topk in ("--prediction-topk", "--no-prediction-topk"):
            got[name, topk] = _summary(
                run_outputs(
                    tmp_path,
                    name + topk,
                    "--mode",
                    "lookahead",
                    "--top-k",
                    "128",
                    "--fetch-ratio",
                    "0.01",
                    topk,
                    *extra,
                )
            )["tpot_ms_p50"]
    cfg = SimConfig(mode="lookahead", top_k=128, concurrency=4)
    pred, _ = make_predictor(cfg)  # run_outputs' predictor (the default)
    blocks = 4 * 4096 // cfg.block_size  # QUICK4's four requests' blocks, about
    topk_ms = 1e3 * pred.time("topk", {"elements": blocks * get_model(cfg.model).n_kv_heads})
    layers = get_model(cfg.model).n_layers
    base_saved = got["base", "--prediction-topk"] - got["base", "--no-prediction-topk"]
    spec_saved = got["spec", "--prediction-topk"] - got["spec", "--no-prediction-topk"]
    assert abs(base_saved) < 0.05 * got["base", "--prediction-topk"]
    assert spec_saved > 0.5 * (layers - 1) * topk_ms

    for topk_kernel, on in (("fused", True), (None, False)):
        rec = build_recording(
            dict(base_config(), speculative_k=1, topk_kernel=topk_kernel), fake_results(accepted_hist={"1": [1, 1]})
        )
        assert sim_config(rec).prediction_topk is on
    assert sim_config(build_recording(base_config(), fake_results())).prediction_topk  # absent: as before
