"""oasis_exec.model.draft_attn on the CPU with the tiny random target: the attention head's incremental decode (prefill
chunks, then one position a step, several lanes at different lengths) equals its full-sequence forward; the engine
runs lookahead with it (every position written once, its drafts those of the full-sequence forward over the
generated text, outputs equal dense's when K covers every block); after a speculative step at k = 1 it appends
exactly the accepted positions (``propose_accepted``: what one ``step_hidden`` a position gives, nothing written past
a lane's length, also at the end of its buffer); the single-key head still runs; speculative chains (k >= 2) are
refused with it (k = 1 in the engine: tests/integration/test_exec_spec_attn.py)."""

import pytest
import torch
from exec_cases import cfg, prompts, run_logits

from oasis_core.specs import get_model
from oasis_exec.model.decoder import Decoder
from oasis_exec.model.draft_attn import AttnDraftHead, AttnShape, hidden_seq, logits_seq

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dec():
    return Decoder.build(get_model("tiny"), None, seed=3, dtype=torch.float32, device="cpu")


def head_of(dec, **kw):
    return AttnDraftHead.build(dec.shape, dec.embed, None, 64, 7, torch.float32, "cpu", dec.lm_head, **kw)


def test_incremental_decode_equals_the_full_sequence_forward(dec):
    h = dec.shape.hidden
    g = torch.Generator().manual_seed(0)
    head = head_of(dec, max_lanes=3, max_len=64)
    T = {0: 40, 2: 29}  # two lanes, different lengths, prefilled in different chunkings
    aux = {ln: torch.randn(t, 3 * h, generator=g) for ln, t in T.items()}
    tok = {ln: torch.randint(0, dec.shape.vocab, (t + 1,), generator=g) for ln, t in T.items()}
    ref = {
        ln: hidden_seq(head.w, head.attn, dec.shape.rms_eps, aux[ln][None], dec.embed[tok[ln][1:]][None])[0] for ln in T
    }
    chunks = {0: [(0, 7), (7, 20)], 2: [(0, 1), (1, 4), (4, 10)]}  # prompts of 20 and 10 tokens
    for ln, cs in chunks.items():
        for a, b in cs:
            head.prefill_chunk(ln, a, aux[ln][a:b], tok[ln][a:b])
        assert int(head.kv.n[ln]) == b - 1
    got = {ln: [] for ln in T}
    p = {ln: cs[-1][1] - 1 for ln, cs in chunks.items()}  # next position of each lane
    while any(p[ln] < T[ln] for ln in T):
        lanes = [ln for ln in T if p[ln] < T[ln]]
        a = torch.stack([aux[ln][p[ln]] for ln in lanes])
        t = torch.stack([tok[ln][p[ln] + 1] for ln in lanes])
        out = head.step_hidden(lanes, a, t)
        for i, ln in enumerate(lanes):
            got[ln].append(out[i])
            p[ln] += 1
    for ln, cs in chunks.items():
        first = cs[-1][1] - 1
        torch.testing.assert_close(torch.stack(got[ln]), ref[ln][first:], atol=1e-5, rtol=1e-5)
        assert int(head.kv.n[ln]) == T[ln]
    # The written keys are the full sequence's (RoPE at each position).
    from oasis_exec.model.draft_attn import layer_input, project_qkv

    fused = aux[0] @ head.w["fc.weight"].t()
    _, k, v = project_qkv(
        head.w, head.attn, layer_input(head.w, dec.shape.rms_eps, fused, dec.embed[tok[0][1:]]), torch.arange(T[0])
    )
    torch.testing.assert_close(head.kv.k[0, : T[0]], k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(head.kv.v[0, : T[0]], v, atol=1e-5, rtol=1e-5)
    # An attention shape of its own (fewer heads than the target's) runs and saves / loads.
    assert head.attn == AttnShape.of(dec.shape)


def test_accepted_positions_are_sequential_steps(dec):
    """``propose_accepted`` (after a k = 1 speculative step) = ``step_hidden`` of each accepted position in turn: 2
    positions for a lane that accepted its draft, 1 for one that did not (its second position never written), and a
    lane at the end of its buffer (its rejected position would lie past it) writes nothing out of bounds."""
    h, L = dec.shape.hidden, 24
    g = torch.Generator().manual_seed(1)
    spec, seq = head_of(dec, max_lanes=4, max_len=L), head_of(dec, max_lanes=4, max_len=L)
    lens = [5, 9, 12, L - 1]  # lane 3: one position left
    for ln, t in enumerate(lens):
        a = torch.randn(t + 1, 3 * h, generator=g)
        tk = torch.randint(0, dec.shape.vocab, (t + 1,), generator=g)
        for hd in (spec, seq):
            hd.prefill_chunk(ln, 0, a, tk)
    lanes = torch.tensor([3, 0, 2, 1])
    acc = torch.tensor([0, 1, 0, 1])
    aux = torch.randn(4, 2, 3 * h, generator=g)
    tok = torch.randint(0, dec.shape.vocab, (4, 2), generator=g)
    n0 = spec.kv.n.clone()
    got = spec.accepted_hidden(lanes, aux, tok, acc)
    want = []
    for i, ln in enumerate(lanes.tolist()):
        for j in range(int(acc[i]) + 1):
            out = seq.step_hidden([ln], aux[i, j][None], tok[i, j][None])
        want.append(out[0])
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=1e-5)
    assert spec.kv.n.tolist() == seq.kv.n.tolist() == (n0 + 1 + torch.tensor([1, 1, 0, 0])).tolist()
    torch.testing.assert_close(spec.kv.k, seq.kv.k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(spec.kv.v, seq.kv.v, atol=1e-6, rtol=1e-6)
    for ln in range(4):  # nothing past a lane's length (the buffers start zero)
        assert not spec.kv.k[ln, int(spec.kv.n[ln]) :].any()


def test_own_attention_shape_round_trips(dec, tmp_path):
    from oasis_exec.model.draft import random_draft_weights

    s = dec.shape
    a = AttnShape(n_heads=2, n_kv_heads=1, head_dim=8, rope_theta=500.0)
    w = random_draft_weights(s, 64, 2, torch.float32)
    w["midlayer.self_attn.q_proj.weight"] = torch.randn(16, 2 * s.hidden) / 8
    w["midlayer.self_attn.k_proj.weight"] = torch.randn(8, 2 * s.hidden) / 8
    w["midlayer.self_attn.v_proj.weight"] = torch.randn(8, 2 * s.hidden) / 8
    w["midlayer.self_attn.o_proj.weight"] = torch.randn(s.hidden, 16) / 4
    head = AttnDraftHead(s, w, dec.embed, dec.lm_head, a, max_lanes=1, max_len=16)
    head.save(str(tmp_path / "d"))
    back = AttnDraftHead.build(s, dec.embed, str(tmp_path / "d"), dtype=torch.float32, max_lanes=1, max_len=16)
    assert back.attn == a
    aux, emb = torch.randn(1, 9, 3 * s.hidden), dec.embed[torch.arange(9)][None]
    torch.testing.assert_close(
        logits_seq(head.w, a, s.rms_eps, aux, emb, head.lm_head),
        logits_seq(back.w, a, s.rms_eps, aux, emb, back.lm_head),
    )


def _record(store):
    def hook(runner):
        head = runner.drafts.head
        orig = head.propose_lanes

        def rec(lanes, aux, tok):
            ids = orig(lanes, aux, tok)
            store.append((torch.as_tensor(lanes).tolist(), torch.as_tensor(tok).tolist(), ids.tolist()))
            return ids

        head.propose_lanes = rec
        store.append(head)

    return hook


def test_engine_lookahead_runs_the_attention_head(dec):
    ps, n_new = prompts(), 12
    ref, out_ref = run_logits(cfg("dense"), ps, n_new)
    calls = []
    got, out = run_logits(cfg("lookahead", top_k=32, fetch_ratio=1.0, draft_head="attn"), ps, n_new, _record(calls))
    assert out == out_ref
    for rid in ref:
        for a, b in zip(ref[rid], got[rid]):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)
    head, calls = calls[0], calls[1:]
    # Every position of each lane written once: prompt + every produced token but the last.
    assert sorted(int(head.kv.n[ln]) for ln in range(3)) == sorted(len(p) + n_new - 1 for p in ps)
    # Each lane's drafts are those of the full-sequence forward over its final text (the dense target's features).
    seqs = {}
    for lanes, toks, ids in calls:
        for ln, t, d in zip(lanes, toks, ids):
            seqs.setdefault(ln, []).append((t, d))
    assert len(seqs) == 3
    dec_eng = Decoder.build(get_model("tiny"), None, seed=0, dtype=torch.float32, device="cpu")  # the engine's
    for ln, steps in seqs.items():
        p = next(p for p, o in zip(ps, out) if len(p) + n_new - 1 == int(head.kv.n[ln]))
        full = torch.tensor(p + [t for t, _ in steps])  # the prompt, then the sampled token of each proposal
        assert full.tolist()[len(p) :] == out[ps.index(p)][: len(steps)]
        feats = {}

        def hook(i, q, k, v, x, feats=feats):
            if i in head.layers:
                feats[i] = x

        dec_eng.forward_dense(full[:-1], hook)
        aux = torch.cat([feats[i] for i in head.layers], -1)[None]
        hs = hidden_seq(head.w, head.attn, dec.shape.rms_eps, aux, dec_eng.embed[full[1:]][None])[0]
        want = head._ids(hs[len(p) - 1 :])  # the draft vocabulary's argmax, mapped to the target's ids (d2t)
        assert [d for _, d in steps] == want.tolist()


def test_single_key_head_still_runs_and_chains_are_refused():
    ps = prompts()
    a = run_logits(cfg("lookahead", draft_head="single"), ps, 6)[1]
    b = run_logits(cfg("lookahead"), ps, 6)[1]
    assert a == b and all(len(o) == 6 for o in a)
    with pytest.raises(ValueError, match="draft_head=attn speculates at k = 1 only"):
        cfg("lookahead", draft_head="attn", speculative_k=2)
    assert cfg("lookahead", draft_head="attn", speculative_k=1).spec_max_k == 1  # k = 1 runs


def test_synthesized_prompts_fill_the_draft_kv():
    from exec_cases import run_synthesized

    ps = prompts()
    eng, out, _ = run_synthesized(cfg("lookahead", draft_head="attn"), ps, 5)
    head = eng.runner.drafts.head
    # A synthesized prompt fills positions 0 .. len - 2; each of the 5 steps writes its own position.
    assert sorted(int(head.kv.n[ln]) for ln in range(3)) == sorted(len(p) - 1 + 5 for p in ps)
    assert all(len(o) == 5 for o in out)
    eng.close()


def test_every_position_written_once_through_short_steps_and_the_crossing():
    ps, n_new = prompts(), 30  # top_k 4: 33 tokens stay short, 70 cross at 80, 100 start long
    got = []
    run_logits(cfg("lookahead", draft_head="attn"), ps, n_new, lambda r: got.append(r.drafts.head))
    assert sorted(int(got[0].kv.n[ln]) for ln in range(3)) == sorted(len(p) + n_new - 1 for p in ps)


def test_a_head_directory_of_the_other_kind_is_refused(dec, tmp_path):
    """The engine's draft_head must match the saved head's kind (its config.json): an attention head's weights would
    otherwise load into the single-key layer (and a single-key head has no q/k projections)."""
    from oasis_exec.engine.engine import Engine
    from oasis_exec.model.draft import DraftHead
    from oasis_exec.model.draft_attn import saved_kind

    attn_dir, single_dir = str(tmp_path / "attn"), str(tmp_path / "single")
    head_of(dec).save(attn_dir)
    DraftHead.build(dec.shape, dec.embed, None, 64, 7, torch.float32, "cpu", lm_head=dec.lm_head).save(single_dir)
    assert (saved_kind(attn_dir), saved_kind(single_dir)) == ("attn", "single")
    for path, asked, saved in ((attn_dir, "single", "attn"), (single_dir, "attn", "single")):
        with pytest.raises(ValueError, match=f"says draft_head '{saved}'.*--draft-head {saved}"):
            Engine(cfg("lookahead", draft_path=path, draft_head=asked))
    eng = Engine(cfg("lookahead", draft_path=attn_dir, draft_head="attn"))  # the matching kind loads
    assert isinstance(eng.runner.drafts.head, AttnDraftHead)
    eng.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("G,D", [(3, 64), (4, 32)])
def test_draft_kv_attend_through_the_ring_kernel_equals_the_causal_reference(dtype, G, D):
    """``DraftKV.attend`` on CUDA is ``oasis_kernels.ring_attn`` over the [lanes, max_len, Hkv, D] buffer read as a ring
    of ``max_len`` slots with the whole ring as its window; here that kernel (Triton interpreter) on the buffer's
    transposed views against the plain causal attention this head computed before (the lanes gathered, positions
    0 .. pos, fp32 einsums). The positions past each query are NaN, so a kernel that read them would fail."""
    import oasis_kernels  # noqa: F401  (the Triton interpreter on without CUDA)
    from oasis_exec.model.draft_attn import DraftKV
    from oasis_kernels.ring_attn import ring_attn

    Hkv, T = 2, 48
    a = AttnShape(G * Hkv, Hkv, D, 10000.0)
    kv = DraftKV(a, 6, T, dtype, "cpu")
    g = torch.Generator().manual_seed(5)
    kv.k.copy_(torch.randn(kv.k.shape, generator=g).to(dtype))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g).to(dtype))
    lanes = torch.tensor([4, 0, 5, 2])
    pos = torch.tensor([0, 17, 47, 30])  # the first position, mid-tile, the buffer's last, a tile boundary-ish
    q = torch.randn(4, G * Hkv, D, generator=g).to(dtype)
    k_ref, v_ref = kv.k[lanes].float(), kv.v[lanes].float()
    qg = q.float().view(4, Hkv, G, D)
    sc = torch.einsum("bhgd,bthd->bhgt", qg, k_ref) / D**0.5
    live = torch.arange(T)[None, :] <= pos[:, None]
    sc = sc.masked_fill(~live[:, None, None, :], float("-inf"))
    ref = torch.einsum("bhgt,bthd->bhgd", torch.softmax(sc, -1), v_ref).reshape(4, G * Hkv, D)
    cpu = kv.attend(q, lanes, pos)  # off CUDA: the reference path, in q's dtype
    torch.testing.assert_close(cpu, ref.to(dtype), rtol=1e-5 if dtype == torch.float32 else 1.6e-2, atol=1e-5)
    for b, lane in enumerate(lanes.tolist()):  # poison what no query may see
        kv.k[lane, pos[b] + 1 :] = float("nan")
        kv.v[lane, pos[b] + 1 :] = float("nan")
    out = torch.empty(4, 1, G * Hkv, D, dtype=torch.float32)
    ring_attn(q[:, None], kv.k.transpose(1, 2), kv.v.transpose(1, 2), lanes, pos[:, None], T, out=out, n_split=2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 0], ref, rtol=1e-5, atol=2e-6)  # fp32 math on both (bf16 K/V exact in fp32)


def test_draft_kv_attend_with_a_head_dim_the_kernel_cannot_tile():
    """A head dim that is no power of two (80) takes the reference path on every device (`ops.ring_attn`): causal over
    0 .. pos."""
    from oasis_exec.model.draft_attn import DraftKV

    kv = DraftKV(AttnShape(4, 2, 80, 10000.0), 3, 20, torch.float32, "cpu")
    g = torch.Generator().manual_seed(1)
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    q = torch.randn(2, 4, 80, generator=g)
    lanes, pos = torch.tensor([2, 0]), torch.tensor([5, 19])
    out = kv.attend(q, lanes, pos)
    for b in range(2):
        k, v = kv.k[lanes[b], : pos[b] + 1], kv.v[lanes[b], : pos[b] + 1]  # [t, 2, 80]
        for h in range(4):
            p = torch.softmax(k[:, h // 2] @ q[b, h] / 80**0.5, 0)
            torch.testing.assert_close(out[b, h], p @ v[:, h // 2], rtol=1e-5, atol=1e-6)
