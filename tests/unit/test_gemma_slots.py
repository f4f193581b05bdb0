"""``experiments/long_context_draft/gemma_slots.py`` (issue 37: real fetches at S = K, 2K, 3K from a dump of
Gemma's full layers vs the synthetic generator) on small made-up dumps: exact outcomes where they are known."""

import json

import pytest
import torch
from experiment_scripts import load_script


def _dump(n=512, p=6, moving=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = {li: torch.randn(n, 1, 8, generator=g) for li in (5, 11, 17)}
    q = {li: torch.randn(1, 4, 8, generator=g).repeat(p, 1, 1) for li in k}  # the same query at every position
    if moving:  # a fresh random query each position: the true sets churn
        q = {li: torch.randn(p, 4, 8, generator=g) for li in k}
    q_next = {li: torch.cat([q[li][1:], q[li][-1:]]) for li in k} if moving else q
    ts = torch.arange(n - p - 1, n - 1)
    return {"text": "x", "n": n, "ts": ts, "k": k, "q_cur": q, "q_next": q_next}


def test_a_still_query_fetches_nothing_and_its_statistics_say_so():
    gs = load_script("long_context_draft/gemma_slots.py")
    d = _dump()
    sets = gs.true_sets(d, 4)
    m, stats = gs.measured(sets, 4, 32)
    assert stats["adjacent_overlap"] == 1.0 and stats["proxy_recall"] == 1.0
    assert stats["new_per_step"] == 0.0 and stats["new_late"] == 0.0
    assert gs.real_fetch(sets) == {1.0: 0.0, 2.0: 0.0, 3.0: 0.0}


def test_churning_queries_fetch_less_with_more_slots(tmp_path):
    gs = load_script("long_context_draft/gemma_slots.py")
    sets = gs.true_sets(_dump(moving=True, p=12), 6)
    f = gs.real_fetch(sets)
    assert f[1.0] > 0 and f[1.0] >= f[2.0] >= f[3.0]
    p = tmp_path / "d.pt"
    torch.save(_dump(moving=True, p=12), p)
    out = tmp_path / "o.json"
    gs.main([str(p), "--ks", "6", "--fit-k", "6", "--preset", "paper", "--seeds", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    rows = {r["preset"]: r for r in doc["rows"]}
    assert set(rows) == {"fit@K=6", "paper"}
    assert rows["paper"]["real_fetch"]["lookahead"]["1.0"] == pytest.approx(f[1.0])


def test_both_dump_formats_and_the_sets_npz_give_the_same_figures(tmp_path):
    """A later dump (every layer's cache ``kc``, the full layers' queries ``qk`` at t0 .. t0 + P) reads as the first
    format; the sets saved from it replay to the same fetches and statistics as the dump itself."""
    gs = load_script("long_context_draft/gemma_slots.py")
    d = _dump(moving=True, p=12)
    qk = {li: torch.cat([d["q_cur"][li], d["q_next"][li][-1:]]) for li in d["k"]}
    kc = [d["k"].get(i, torch.zeros(3, 1, 8)) for i in range(18)]
    torch.save({"text": "x", "n": d["n"], "ts": d["ts"], "kc": kc, "vc": kc, "start": [0] * 18, "qk": qk},
               tmp_path / "new.pt")  # fmt: skip
    new = gs.load_dump(str(tmp_path / "new.pt"))
    a, b = gs.true_sets(d, 6), gs.true_sets(new, 6)
    assert all((a[w] == b[w]).all() for w in ("seq", "proxy"))
    assert a["seq"].shape == (3, 13, 6) and a["proxy"].shape == (3, 12, 6)
    npz = tmp_path / "sets.npz"
    gs.main([str(tmp_path / "new.pt"), "--ks", "6", "--preset", "paper", "--seeds", "1", "--save-sets", str(npz),
             "--out", str(tmp_path / "a.json")])  # fmt: skip
    gs.main([str(npz), "--n", str(d["n"]), "--ks", "6", "--preset", "paper", "--seeds", "1",
             "--out", str(tmp_path / "b.json")])  # fmt: skip
    ra, rb = (json.loads((tmp_path / f).read_text())["rows"] for f in ("a.json", "b.json"))
    assert ra == rb
    ts, by_k = gs.load_sets(str(npz), d["n"])
    assert (ts == d["ts"].numpy()).all() and (by_k[6]["seq"] == a["seq"]).all()
