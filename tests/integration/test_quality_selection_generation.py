"""``quality selection --generate``: the target's own continuation (greedy == the plain forward's argmax at every
step; sampled, seeded), the attention head's drafts == its incremental decode, and the CLI in generation with K in
blocks, reported layers and token texts from an .npz."""

import json

import numpy as np
import pytest
import torch

from oasis_core.specs import ModelSpec
from oasis_exec import __main__ as exec_main
from oasis_exec.model.decoder import Decoder
from oasis_exec.model.draft_attn import AttnDraftHead
from oasis_exec.tools.quality import texts
from oasis_exec.tools.quality.generation import attn_draft_tokens, continue_ids, npz_ids

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


class _Chars:
    def encode(self, text):
        return [ord(c) % TINY.vocab for c in text]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dec():
    return Decoder.build(TINY, seed=3, dtype=torch.float32)


def test_greedy_continuation_is_the_forward_argmax(dec):
    prompt = list(range(5, 25))
    seq = continue_ids(dec, prompt, 8)
    assert seq[:20] == prompt and len(seq) == 28
    for t in range(20, 28):
        assert int(dec.forward_dense(torch.tensor(seq[:t]))[-1].argmax()) == seq[t]
    a, b = continue_ids(dec, prompt, 8, 5.0, seed=1), continue_ids(dec, prompt, 8, 5.0, seed=1)  # flat: seeds differ
    assert a == b and a != continue_ids(dec, prompt, 8, 5.0, seed=2) and a != seq


def test_forward_keeps_only_the_asked_logits(dec):
    # continue_ids and dense_trace ask for one row: the full [T, V] logits are 17 GB for Gemma at 16K
    tokens = torch.tensor(list(range(3, 40)))
    full = dec.forward_dense(tokens)
    torch.testing.assert_close(dec.forward_dense(tokens, keep=[36]), full[36:])
    torch.testing.assert_close(dec.forward(tokens.view(1, -1).repeat(2, 1), keep=[4, 20])[1], full[[4, 20]])


def test_attention_drafts_equal_the_incremental_decode(dec):
    head = AttnDraftHead.build(TINY, dec.embed, None, 40, 2, torch.float32, "cpu", dec.lm_head, 1, 64)
    tokens = torch.tensor(continue_ids(dec, list(range(3, 30)), 10))
    feats = {}

    def hook(i, q, k, v, x):
        if i in head.layers:
            feats[i] = x

    dec.forward_dense(tokens, hook)
    aux = torch.cat([feats[i] for i in head.layers], -1)
    ts = torch.arange(28, 36)
    got, prob = attn_draft_tokens(head, dec, aux, tokens, ts, with_prob=True)
    assert torch.equal(got, attn_draft_tokens(head, dec, aux, tokens, ts))
    head.want_conf = True  # the engine's draft gate reads the head's probability of its token
    head.prefill_chunk(0, 0, aux[:27], tokens[:27])  # the engine: prefill of 27 tokens, then a step a position
    want = [int(head.propose_lanes([0], aux[26:27], tokens[27:28])[0])]
    conf = [float(head.conf[0])]
    for p in range(27, 35):
        want.append(int(head.propose_lanes([0], aux[p : p + 1], tokens[p + 1 : p + 2])[0]))
        conf.append(float(head.conf[0]))
    assert got[:, 0].tolist() == want[1:]  # the draft for t + 1 = the proposal after entry t - 1
    assert (got[:, 1] != got[:, 0]).all()  # and the second-best token beside it
    assert prob[:, 0].tolist() == pytest.approx(conf[1:], rel=1e-4)  # the engine's probability of the same draft


def test_the_gate_predicts_from_the_current_query_where_the_head_is_unsure_and_lookup_has_no_match():
    from oasis_exec.tools.quality.drafts import gated_positions, lookup_matched

    tokens = [5, 6, 7, 8, 5, 6, 7, 9, 1, 2]
    ts = torch.tensor([6, 8, 9])  # t = 6: "5 6 7" seen before (a match of 3); t = 8, 9: "9 1", "1 2" never seen
    assert lookup_matched(tokens, ts, 2).tolist() == [True, False, False]
    prob = torch.tensor([0.1, 0.2, 0.9])
    assert gated_positions(tokens, ts, prob, 0.5, 2).tolist() == [False, True, False]
    assert gated_positions(tokens, ts, prob, 0.0, 2).tolist() == [False, False, False]  # gate 0: never


def test_cli_in_generation(monkeypatch, tmp_path):
    monkeypatch.setattr(Decoder, "from_path", staticmethod(lambda *a, **k: Decoder.build(TINY, seed=3)))
    monkeypatch.setattr(texts, "hf_tokenizer", lambda path: _Chars())
    npz = tmp_path / "ids.npz"
    np.savez(npz, held=np.arange(300).reshape(2, 150) % TINY.vocab)
    out = tmp_path / "sel.json"
    argv = ["quality", "selection", "--model-path", "README.md", "--texts", "shlex.py", "--n-tokens", "120"]
    argv += ["--token-texts", f"{npz}:held:1", "--k-blocks", "3", "5", "--block-size", "8", "--positions", "6"]
    argv += [
        "--drafts",
        "eagle3_attn",
        "ngram_attn",
        "ngram1_attn",
        "attn_top2",
        "ngram_attn_cur",
        "ngram_attn_gate",
        "attn_soft",
        "eagle3",
        "oracle",
        "random",
        "--generate",
        "sample",
    ]
    argv += ["--report-layers", "1"]
    argv += ["--no-fit", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert exec_main.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["generation"] == "sampled, T = 0.7" and doc["draft_attn_head"]["kind"] == "attn"
    assert sorted(doc["average"]) == ["120@K3", "120@K5"]
    assert {r["text"] for r in doc["results"]} == {"shlex.py", "ids:held:1"}
    for r in doc["results"]:
        assert r["k_blocks"] in (3, 5) and r["k"] == r["k_blocks"] and r["layers_reported"] == [1]
        assert len(r["per_layer"]["proxy"]) == 1 and len(r["drafts"]["eagle3_attn"]["sparse"]["per_layer"]) == 1
        assert 0.0 <= r["drafts"]["ngram_attn"]["token_accuracy"] <= 1.0 and "ngram" not in r["drafts"]
        assert 0.0 <= r["drafts"]["ngram1_attn"]["token_accuracy"] <= 1.0
        assert r["drafts"]["attn_top2"]["token_accuracy"] == r["drafts"]["eagle3_attn"]["token_accuracy"]
        assert r["drafts"]["ngram_attn_cur"]["token_accuracy"] == r["drafts"]["ngram_attn"]["token_accuracy"]
        assert r["drafts"]["attn_soft"]["token_accuracy"] == r["drafts"]["eagle3_attn"]["token_accuracy"]
        # gated: the pair's token; a position's agreement is the proxy's where gated, the pair's elsewhere (random
        # head weights: unsure wherever prompt lookup, which matches these repeating texts often, has no match)
        g, pair = r["drafts"]["ngram_attn_gate"], r["drafts"]["ngram_attn"]
        assert g["token_accuracy"] == pair["token_accuracy"] and 0.0 < g["gated_share"] <= 1.0
        proxy_pp = r["proxy_per_position"]
        took = [a == p for a, p in zip(g["sparse_per_position"], proxy_pp)]
        assert all(a == p or a == q for a, p, q in zip(g["sparse_per_position"], proxy_pp, pair["sparse_per_position"]))
        assert sum(took) >= round(g["gated_share"] * 6)
        assert r["drafts"]["oracle"]["token_accuracy"] == 1.0  # the oracle is the token the target produced
        assert r["drafts"]["oracle"]["dense"]["mean"] == 1.0  # and its dense query is the true next query
        for f in r["drafts"].values():  # per decode position: the sparse agreement (its mean is the mean's)
            assert len(f["sparse_per_position"]) == 6 == len(f["right_per_position"])
            assert np.mean(f["sparse_per_position"]) == pytest.approx(f["sparse"]["mean"], abs=1e-6)
            assert np.mean(f["right_per_position"]) == pytest.approx(f["token_accuracy"])
        assert np.mean(r["proxy_per_position"]) == pytest.approx(r["mean"]["proxy"], abs=1e-6)
        assert r["drafts"]["oracle"]["right_per_position"] == [1.0] * 6
    for a in doc["average"].values():
        assert len(a["drafts"]["eagle3_attn"]["sparse_per_position"]) == 6 and len(a["proxy_per_position"]) == 6
    name, ids = npz_ids(f"{npz}:held:1", 120)
    assert name == "ids:held:1" and ids == [int(t) for t in (np.arange(150, 270) % TINY.vocab)]


def test_synthetic_vs_real_reads_the_replay(monkeypatch, tmp_path, capsys):
    from experiment_scripts import load_script

    monkeypatch.setattr(Decoder, "from_path", staticmethod(lambda *a, **k: Decoder.build(TINY, seed=3)))
    monkeypatch.setattr(texts, "hf_tokenizer", lambda path: _Chars())
    out = tmp_path / "sel.json"
    argv = ["quality", "selection", "--model-path", "README.md", "--texts", "shlex.py", "--n-tokens", "200"]
    argv += ["--k-blocks", "4", "--block-size", "8", "--positions", "12", "--drafts", "ngram", "oracle"]
    argv += ["--generate", "greedy", "--policies", "unlimited", "--slots-ratio", "1", "2", "3"]
    argv += ["--policy-draft", "ngram", "--fit-draft", "ngram", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert exec_main.main(argv) == 0
    svr = load_script("long_context_draft/synthetic_vs_real.py")
    doc = json.loads(out.read_text())
    real = svr.real_fetch(doc["results"][0])
    assert sorted(real) == [1.0, 2.0, 3.0] and real[1.0] >= real[2.0] >= real[3.0] >= 0  # more slots, fewer fetches
    rc = svr.main([str(out), "--preset", "smollm2", "fit:ngram", "--out", str(tmp_path / "svr.json")])
    rows = json.loads((tmp_path / "svr.json").read_text())["rows"]
    assert [r["preset"] for r in rows] == ["smollm2", "fit:ngram"]
    assert rc == (0 if all(r["within_tolerance"] for r in rows) else 1)
    for r in rows:
        assert set(r["real_savings"]) == {"2.0", "3.0"}  # JSON keys: the ratios S / K


def test_a_hedge_scores_each_block_by_the_larger_of_its_two_queries():
    from oasis_core.scoring import build_summaries, score_blocks
    from oasis_exec.tools.quality.selection import _side_by_side

    g = torch.Generator().manual_seed(5)
    hkv, hq, d = 2, 6, 8
    k = torch.randn(hkv, 64, d, generator=g)
    kmin, kmax = build_summaries(k, 8)
    qa, qb = torch.randn(4, hq, d, generator=g), torch.randn(4, hq, d, generator=g)
    want = torch.maximum(score_blocks(qa, kmin[None], kmax[None]), score_blocks(qb, kmin[None], kmax[None]))
    torch.testing.assert_close(score_blocks(_side_by_side(qa, qb, hkv), kmin[None], kmax[None]), want)


def test_a_soft_draft_of_one_token_is_the_heads_draft(monkeypatch, tmp_path):
    """attn_soft over the head's single best token (weight 1) runs the same row as eagle3_attn: equal agreement at
    every position; over four tokens it differs (the rows' inputs are mixed)."""
    from oasis_exec.tools.quality import drafts

    monkeypatch.setattr(Decoder, "from_path", staticmethod(lambda *a, **k: Decoder.build(TINY, seed=3)))
    monkeypatch.setattr(texts, "hf_tokenizer", lambda path: _Chars())
    got = {}
    for n in (1, 4):
        monkeypatch.setitem(drafts.SOFT, "attn_soft", n)
        out = tmp_path / f"soft{n}.json"
        argv = ["quality", "selection", "--model-path", "README.md", "--texts", "shlex.py", "--n-tokens", "120"]
        argv += ["--k-blocks", "3", "--block-size", "8", "--positions", "6", "--drafts", "eagle3_attn", "attn_soft"]
        argv += ["--generate", "greedy", "--no-fit", "--device", "cpu", "--threads", "1", "--out", str(out)]
        assert exec_main.main(argv) == 0
        r = json.loads(out.read_text())["results"][0]["drafts"]
        got[n] = (r["attn_soft"]["dense"]["per_layer"], r["eagle3_attn"]["dense"]["per_layer"])
    assert got[1][0] == pytest.approx(got[1][1], abs=1e-6)
    assert got[4][0] != pytest.approx(got[4][1], abs=1e-6)
