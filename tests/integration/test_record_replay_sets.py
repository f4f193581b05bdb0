"""Recorded selected block sets (``--record-path``, ``oasis_core.setrecord``): written when the engine closes, read
back by ``selection=replay`` at the same shape (identical sets) and at another one (the Qwen3-8B shape, dummy
weights), and readable by the simulator (schema selection file and ReplaySets)."""

import json

import numpy as np
import pytest
import torch

from oasis_core.recording import load_selection
from oasis_core.setrecord import (
    SetRecorder,
    SetReplay,
    churn_stats,
    dedup_rows,
    load_setrecord,
    map_columns,
    map_ids,
    to_sim_replay,
)
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cfg(mode="lookahead", **kw):
    base = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        top_k=4,
        max_context=256,
        max_lanes=3,
        block_size=16,
        draft_vocab=64,
        prefill_chunk=64,
        fetch_ratio=0.5,
    )
    base.update(kw)
    return ExecConfig(**base)


def prompts(seed=0, lens=(90, 41, 120)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 250, (n,), generator=g).tolist() for n in lens]


def run(c, ps, steps=20):
    eng = Engine(c)
    out = eng.generate(ps, SamplingParams(max_tokens=steps))
    eng.close()
    return out


@pytest.mark.parametrize("mode", ["lookahead", "quest", "retrieval", "proxy"])
def test_record_then_replay_same_shape_gives_equal_sets(tmp_path, mode):
    a, b = str(tmp_path / "a.sel.npz"), str(tmp_path / "b.sel.npz")
    ps = prompts()
    run(cfg(mode, record_path=a), ps)
    rec = load_setrecord(a)
    assert rec.meta["mode"] == mode and rec.meta["model"] == "tiny" and rec.meta["top_k"] == 4
    assert rec.meta["block_size"] == 16 and rec.meta["n_layers"] == 2 and rec.meta["n_kv_heads"] == 2
    assert rec.meta["truncated_steps"] == 0
    assert rec.requests == [0, 1, 2] and [rec.request_steps(r) for r in rec.requests] == [19] * 3
    sets, req, pos, nb = rec.step(rec.steps - 6)
    assert sets.shape == (2, 3, 2, 4) and list(req) == [0, 1, 2]
    ahead = mode in ("lookahead", "proxy")
    assert list(nb) == [(p + ahead) // 16 + 1 for p in pos]
    assert (sets < (nb - 1)[None, :, None, None]).all()  # only eligible blocks (never the local one)
    # replay (same shape, same prompts) and record again: the same sets, step by step
    run(cfg(mode, selection="replay", replay_path=a, record_path=b), ps)
    rec_b = load_setrecord(b)
    assert rec_b.meta["selection"] == "replay"
    np.testing.assert_array_equal(rec.step_sets, rec_b.step_sets)
    np.testing.assert_array_equal(rec.item_nblocks, rec_b.item_nblocks)


def test_replay_changes_what_attention_reads(tmp_path):
    """A replayed run attends the recorded sets: a recording from other prompts changes the logits' path
    (the sets come from the file, not from this run's scores)."""
    a = str(tmp_path / "a.npz")
    run(cfg("quest", record_path=a, top_k=2), prompts(seed=1))
    own = run(cfg("quest", top_k=2), prompts())
    rep = run(cfg("quest", top_k=2, selection="replay", replay_path=a), prompts())
    assert own != rep


def test_file_is_a_schema_selection_file_and_sim_replays_it(tmp_path):
    a = str(tmp_path / "a.sel.npz")
    run(cfg("lookahead", record_path=a), prompts(), steps=12)
    sets, layers = load_selection(a, top_k=4)  # traces/SCHEMA.md "Selected block sets"
    assert sets.shape == (11, 2 * 2, 4) and list(layers) == [0, 1]
    rec = load_setrecord(a)
    per = rec.request_sets(int(np.load(a)["request"]))[0]
    np.testing.assert_array_equal(sets, per.reshape(11, 4, 4))
    # the simulator's own replay reader and policy runner, at the Qwen3-8B shape
    from oasis_sim.config import make_config
    from oasis_sim.policy import PolicyRunner, ReplaySets

    js = str(tmp_path / "replay.json")
    assert to_sim_replay(rec, js) == 2
    rs = ReplaySets(js, 4)
    assert rs.rows == 4 and len(rs.steps) == 10
    sim = make_config(
        dict(model="qwen3-8b", mode="lookahead", top_k=4, selection="replay", replay_file=js, policy_layers=2)
    )
    r = PolicyRunner(sim, [100], 0, rs)
    fetched = [r.step()[0].sum() for _ in range(10)]
    assert sum(fetched) >= 0


def test_replay_at_the_qwen3_shape_dummy_weights(tmp_path):
    """A tiny-model recording (2 layers, 2 KV heads, K 4, 256 tokens) replayed by a Qwen3-8B-shaped executor run
    with dummy weights (36 layers, 8 KV heads, K 8): rows map by (layer, head) modulo, columns tile, ids wrap."""
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    run(cfg("lookahead", record_path=a), prompts(), steps=16)
    from oasis_core.specs import get_model

    s = get_model("qwen3-8b")
    c = ExecConfig(
        model="qwen3-8b",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        top_k=8,
        max_context=400,
        max_lanes=2,
        block_size=16,
        draft_vocab=64,
        selection="replay",
        replay_path=a,
        record_path=b,
        fetch_ratio=0.5,
    )
    # a cut-down Qwen3-8B width (same layer / head counts) keeps the CPU run short
    from dataclasses import replace

    from oasis_exec.runner.runner import Runner

    shape = replace(s, hidden=64, n_q_heads=16, head_dim=16, mlp_hidden=64, vocab=256)
    runner = Runner(c, shape=shape)
    eng = Engine(c, runner)
    eng.generate([[1 + i % 250 for i in range(299)], list(range(5, 200))], SamplingParams(max_tokens=10))
    eng.close()
    src, dst = load_setrecord(a), load_setrecord(b)
    assert dst.L == 36 and dst.H == 8 and dst.K == 8 and dst.meta["model"] == "qwen3-8b"
    for k in range(9):
        for i, req in enumerate(dst.requests):
            got, nb = dst.request_step(req, k)  # [36, 8, 8]
            want, nb_src = src.request_step(src.requests[i], k)  # [2, 2, 4]
            span = int(src.request_sets(src.requests[i])[1].max()) - 1
            for l in (0, 1, 17, 35):
                for h in (0, 3, 7):
                    row = want[l % 2, h % 2]
                    tiled = np.concatenate([np.where(row >= 0, row + i_ * span, -1) for i_ in range(2)])
                    exp = map_ids(tiled[None], nb - 1)[0]
                    np.testing.assert_array_equal(got[l, h], exp)
    # the target context (300 tokens) holds every recorded id: the first K columns are the recorded ids as they are
    got0 = dst.request_sets(dst.requests[0])[0][:, :2, :2, :4]
    want0 = src.request_sets(src.requests[0])[0][:9]
    np.testing.assert_array_equal(got0, want0)


def test_wrap_preserves_churn_and_overlap_scale_does_not_merge_when_growing():
    rng = np.random.default_rng(0)
    S, R, K = 40, 6, 8
    sets = np.empty((S, R, K), dtype=np.int64)
    cur = np.stack([rng.choice(50, K, replace=False) for _ in range(R)])
    for t in range(S):  # a few ids change per step
        for r in range(R):
            if rng.random() < 0.5:
                new = rng.choice(np.setdiff1d(np.arange(60), cur[r]))
                cur[r, rng.integers(K)] = new
        sets[t] = cur
    base = churn_stats(sets)
    wrapped = map_ids(sets, 200)  # a larger target context: identity
    np.testing.assert_array_equal(wrapped, sets)
    assert churn_stats(wrapped) == base
    scaled = map_ids(sets, 120, 60, ids="scale")  # twice the context, fixed ratio: injective
    assert churn_stats(scaled) == base
    assert (scaled == sets * 2).all()
    tiled = map_columns(sets, 2 * K, 60)
    st = churn_stats(tiled)
    assert st["overlap"] == pytest.approx(base["overlap"])
    assert st["entering_per_step"] == pytest.approx(2 * base["entering_per_step"])


def test_collisions_and_padding():
    ids = np.array([[5, 9, 5, -1, 14, 4]])
    np.testing.assert_array_equal(dedup_rows(ids), [[5, 9, -1, -1, 14, 4]])
    np.testing.assert_array_equal(map_ids(ids, 5), [[0, 4, -1, -1, -1, -1]])  # 5->0, 9->4, 14->4 (dup), 4->4 dup
    np.testing.assert_array_equal(map_ids(ids, 0), [[-1] * 6])
    np.testing.assert_array_equal(map_columns(ids, 3, 100), [[5, 9, 5]])


def test_recorder_memory_cap_and_at_exit_write(tmp_path, capsys):
    meta = {"mode": "lookahead", "n_layers": 2, "n_kv_heads": 2, "top_k": 3}
    p = str(tmp_path / "cap.npz")
    r = SetRecorder(p, meta, max_bytes=2 * (2 * 2 * 3) * 2)  # two steps of one request, int16
    for k in range(5):
        r.add_step(np.full((2, 2, 3), k), [7], [16 * 3 + k], [4])
    assert "stopped keeping sets after 2 steps" in capsys.readouterr().err
    r._at_exit()  # what the interpreter's exit runs when the engine was never closed
    rec = load_setrecord(p)
    assert rec.steps == 2 and rec.meta["truncated_steps"] == 3 and rec.request_steps(7) == 2
    assert r.write() is None  # written once


def test_bad_files(tmp_path):
    from oasis_core.setrecord import SetRecordError

    p = tmp_path / "x.npz"
    p.write_bytes(b"not a zip")
    with pytest.raises(SetRecordError, match="x.npz"):
        load_setrecord(str(p))
    np.savez(str(tmp_path / "y.npz"), meta=np.asarray(json.dumps({"format": "other"})))
    with pytest.raises(SetRecordError, match="meta.format"):
        load_setrecord(str(tmp_path / "y.npz"))
    with pytest.raises(ValueError, match="replay_ids"):
        cfg(selection="replay", replay_path="x", replay_ids="nope")


def test_dense_records_nothing_and_replay_refuses_it(tmp_path):
    a = str(tmp_path / "d.npz")
    run(cfg("dense", record_path=a), prompts(), steps=4)
    rec = load_setrecord(a)
    assert rec.steps == 0 and rec.meta["mode"] == "dense"
    from oasis_core.setrecord import SetRecordError

    with pytest.raises(SetRecordError, match="no recorded step"):
        SetReplay(rec, 2, 2, 4)
