"""``quality selection --policies``: the resident-set replay per fetch-cap policy (``replay_policy``) on hand-built
sets and on the tiny model, and the option from the command line."""

import json

import numpy as np
import pytest
import torch

from oasis_core.fetchcap import get_policy
from oasis_core.specs import ModelSpec
from oasis_exec import __main__ as exec_main
from oasis_exec.model.decoder import Decoder
from oasis_exec.model.draft import DraftHead
from oasis_exec.tools.quality import texts
from oasis_exec.tools.quality.selection import PolicyLink, Setup, measure_tokens, replay_policy

TINY = ModelSpec(  # the tiny model of test_quality_selection.py
    name="tiny",
    n_layers=2,
    n_q_heads=4,
    n_kv_heads=2,
    head_dim=16,
    hidden=64,
    mlp_hidden=128,
    vocab=97,
    max_context_tokens=256,
    rope_theta=10000.0,
    rms_eps=1e-5,
    tie_embeddings=True,
)

POLICIES = ("unlimited", "fixed:0", "fixed:0.05", "drift", "per-layer:0.05", "recall:0.9", "budget:0.5")


def _sets(p=6, r=4, k=5, nb=20, seed=0):
    g = np.random.default_rng(seed)
    preds = np.stack([np.stack([g.permutation(nb)[:k] for _ in range(r)]) for _ in range(p)])
    initial = np.stack([g.permutation(nb)[:k] for _ in range(r)])
    return initial, preds


@pytest.mark.parametrize("spec", POLICIES)
def test_replay_bounds(spec):
    initial, preds = _sets()
    pol = get_policy(spec)
    res, fetch, miss = replay_policy(pol, initial, preds, layers=2, link=PolicyLink())
    assert res.shape == (6, 4, 5) and fetch.shape == miss.shape == (6, 4)
    assert (fetch >= 0).all() and (fetch <= np.minimum(miss, pol.max_cap(5))).all()
    for j in range(6):  # every resident set holds K distinct blocks
        assert all(len(set(row)) == 5 and min(row) >= 0 for row in res[j].tolist())


def test_unlimited_resident_is_the_prediction():
    initial, preds = _sets()
    res, fetch, miss = replay_policy(get_policy("unlimited"), initial, preds)
    for j in range(preds.shape[0]):
        assert [set(r) for r in res[j].tolist()] == [set(r) for r in preds[j].tolist()]
    assert np.array_equal(fetch, miss)


def test_victim_slots_fetch_less_and_attend_the_prediction():
    # Uncapped, S = 2K holds every set the prediction held last step: fewer fetches than S = K, and the K attended
    # slots (the most recently selected) are exactly the predicted set, not all 2K resident blocks.
    initial, preds = _sets()
    pol = get_policy("unlimited")
    att1, fetch1, _ = replay_policy(pol, initial, preds)
    att2, fetch2, miss2 = replay_policy(pol, initial, preds, slots=10)
    assert att2.shape == att1.shape == preds.shape
    assert (fetch2 <= fetch1).all() and fetch2.sum() < fetch1.sum() and np.array_equal(fetch2, miss2)
    for j in range(preds.shape[0]):
        assert [set(r) for r in att2[j].tolist()] == [set(r) for r in preds[j].tolist()]
    assert np.array_equal(replay_policy(pol, initial, preds, slots=5)[0], att1)  # S = K is the default


def test_fixed_zero_never_changes_the_resident_set():
    initial, preds = _sets()
    res, fetch, miss = replay_policy(get_policy("fixed:0"), initial, preds)
    for j in range(preds.shape[0]):
        assert np.array_equal(res[j], initial)
    assert (fetch == 0).all() and (miss > 0).any()


@pytest.fixture(scope="module")
def tiny_out():
    dec = Decoder.build(TINY, seed=3, dtype=torch.float32)
    head = DraftHead.build(dec.shape, dec.embed, path=None, dtype=torch.float32, device="cpu", lm_head=dec.lm_head)
    tokens = torch.randint(TINY.vocab, (90,), generator=torch.Generator().manual_seed(5)).tolist()
    setup = Setup(block_size=8, k_fracs=(0.25,), positions=6, drafts=("eagle3", "ngram"), policies=POLICIES)
    return measure_tokens(dec, tokens, setup, head)[0]


def test_tiny_model_unlimited_equals_prediction_fixed_zero_fetches_nothing(tiny_out):
    pol = tiny_out["policies"]
    assert list(pol["by_policy"]) == list(POLICIES)  # every spec reaches the output
    assert pol["initial"] == "T_t0" and pol["lookahead_draft"] == "eagle3"
    for src in ("lookahead", "proxy"):
        own, unl = pol["prediction"][src], pol["by_policy"]["unlimited"][src]
        for s in ("mass", "recall", "mass_late", "recall_late"):
            assert unl[s] == pytest.approx(own[s], abs=1e-9), (src, s)
        assert unl["fetch"] == pytest.approx(unl["missing"])
        z = pol["by_policy"]["fixed:0"][src]
        assert z["fetch"] == 0.0 and z["missing"] > 0
    # fixed:0 keeps T_t0 whatever the prediction: both sources see the same resident set
    z = pol["by_policy"]["fixed:0"]
    assert z["lookahead"]["mass"] == z["proxy"]["mass"] and z["lookahead"]["recall"] == z["proxy"]["recall"]
    for by in pol["by_policy"].values():
        for f in by.values():
            assert 0 <= f["recall"] <= 1 and 0 < f["mass"] <= 1 + 1e-6
            assert len(f["per_layer"]["mass"]) == TINY.n_layers


class _Chars:
    def encode(self, text):
        return [ord(c) % TINY.vocab for c in text]


def _cli(monkeypatch, tmp_path, *extra):
    monkeypatch.setattr(Decoder, "from_path", staticmethod(lambda *a, **k: Decoder.build(TINY, seed=3)))
    monkeypatch.setattr(texts, "hf_tokenizer", lambda path: _Chars())
    out = tmp_path / "sel.json"
    argv = ["quality", "selection", "--model-path", "README.md", "--texts", "shlex.py", "--n-tokens", "120"]
    argv += ["--k-frac", "0.25", "--block-size", "8", "--positions", "6", "--drafts", "eagle3", "--no-fit"]
    argv += ["--device", "cpu", "--threads", "1", "--out", str(out), *extra]
    return exec_main.main(argv), out


def test_cli_policies_reach_the_json_and_table(monkeypatch, tmp_path, capsys):
    rc, out = _cli(monkeypatch, tmp_path, "--policies", "FIXED:0.05", "budget:0.5")
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["setup"]["policies"] == ["fixed:0.05", "budget:0.5"]  # canonical spelling
    assert doc["setup"]["policy_link"]["bytes_per_block_head"] == 2 * 8 * TINY.head_dim * 2
    avg = next(iter(doc["average"].values()))
    assert list(avg["policies"]["by_policy"]) == ["fixed:0.05", "budget:0.5"]
    assert "budget:0.5" in capsys.readouterr().out


def test_cli_slots_ratio(monkeypatch, tmp_path, capsys):
    # ratio 1 of a multi-ratio run is the default run's by_policy; ratio 2 fetches no more, and its mass and
    # recall are those of the K attended blocks (uncapped: the predicted set's own figures, not 2K blocks' more).
    specs = ("--policies", "unlimited", "fixed:0.05")
    doc0 = json.loads(_cli(monkeypatch, tmp_path, *specs)[1].read_text())
    capsys.readouterr()
    rc, out = _cli(monkeypatch, tmp_path, *specs, "--slots-ratio", "1", "2")
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["setup"]["slots_ratios"] == [1.0, 2.0] and "slots_ratios" not in doc0["setup"]
    for key in ("results", "average"):
        p0 = doc0[key][0] if key == "results" else next(iter(doc0[key].values()))
        p = doc[key][0] if key == "results" else next(iter(doc[key].values()))
        p0, p = p0["policies"], p["policies"]
        assert "by_slots_ratio" not in p0 and "by_policy" not in p and list(p["by_slots_ratio"]) == ["1", "2"]
        assert p["by_slots_ratio"]["1"] == p0["by_policy"]
        one, two = p["by_slots_ratio"]["1"], p["by_slots_ratio"]["2"]
        for spec in ("unlimited", "fixed:0.05"):
            for src in ("lookahead", "proxy"):
                assert two[spec][src]["fetch"] <= one[spec][src]["fetch"] + 1e-12, (spec, src)
        for src in ("lookahead", "proxy"):
            own, unl = p["prediction"][src], two["unlimited"][src]
            assert unl["mass"] == pytest.approx(own["mass"], abs=1e-9) and unl["recall"] == pytest.approx(own["recall"])
        assert sum(two["unlimited"][s]["fetch"] for s in ("lookahead", "proxy")) < sum(
            one["unlimited"][s]["fetch"] for s in ("lookahead", "proxy")
        )
    assert "slots ratio 2:" in capsys.readouterr().out


def test_cli_without_policies_is_unchanged(monkeypatch, tmp_path):
    rc, out = _cli(monkeypatch, tmp_path)
    doc = json.loads(out.read_text())
    assert rc == 0 and "policies" not in doc["setup"] and "policies" not in doc["results"][0]


@pytest.mark.parametrize(
    "extra",
    [
        ("--policies", "nope"),
        ("--policies", "budget:x"),
        ("--policies", "drift", "DRIFT"),
        ("--policies", "drift", "--policy-draft", "ngram"),
        ("--policies", "drift", "--policy-link-gb-s", "0"),
    ],
)
def test_cli_bad_policy_is_one_line_exit_2(monkeypatch, tmp_path, capsys, extra):
    rc, _ = _cli(monkeypatch, tmp_path, *extra)
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert "--polic" in err[0]


@pytest.mark.parametrize(
    "extra",
    [
        ("--policies", "drift", "--slots-ratio", "0.5"),
        ("--policies", "drift", "--slots-ratio", "2", "2.0"),
        (
            "--slots-ratio",
            "2",
        ),
    ],
)
def test_cli_bad_slots_ratio_is_one_line_exit_2(monkeypatch, tmp_path, capsys, extra):
    rc, _ = _cli(monkeypatch, tmp_path, *extra)
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and "--slots-ratio" in err[0], err
