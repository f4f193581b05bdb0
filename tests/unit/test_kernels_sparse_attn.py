"""sparse_attn vs its torch reference and vs dense attention (CPU: Triton interpreter; GPU: marked `gpu`)."""

import math

import pytest
import torch

import oasis_kernels  # noqa: F401  (turns the Triton interpreter on without CUDA, before kernel modules load)
from oasis_kernels.sparse_attn import sparse_attn, sparse_attn_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(B, Hkv, G, Tq, D, BS, S, holes=True, seed=0, device=DEV):
    """Random slots for B*Hkv rows of S full blocks + a local block; some entries -1; extra KV for the drafts."""
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    rows = B * Hkv
    n_slots = rows * (S + 1) + 5
    k_slots = torch.randn(n_slots, BS, D, **kw).to(torch.bfloat16)
    v_slots = torch.randn(n_slots, BS, D, **kw).to(torch.bfloat16)
    perm = torch.randperm(n_slots, **kw)[: rows * (S + 1)].to(torch.int32)
    slot_ids = perm[: rows * S].view(B, Hkv, S).clone()
    if holes:
        slot_ids[torch.rand(B, Hkv, S, **kw) < 0.25] = -1
    local_slot = perm[rows * S :].view(B, Hkv).clone()
    local_len = torch.randint(0, BS + 1, (B,), dtype=torch.int32, **kw)
    local_len[0] = BS
    if B > 1:
        local_len[1] = 1
    q = torch.randn(B, Hkv * G, Tq, D, **kw).to(torch.bfloat16)
    ek = torch.randn(B, Hkv, Tq - 1, D, **kw).to(torch.bfloat16) if Tq > 1 else None
    ev = torch.randn(B, Hkv, Tq - 1, D, **kw).to(torch.bfloat16) if Tq > 1 else None
    return k_slots, v_slots, slot_ids, local_slot, local_len, q, ek, ev


@pytest.mark.parametrize(
    "B,Hkv,G,Tq,D,BS,S,n_split,bpi",
    [
        (2, 2, 2, 2, 16, 4, 5, 1, 2),  # one split: the kernel writes the output itself
        (3, 1, 4, 2, 32, 8, 6, 3, 2),  # three splits merged; local block in the last split
        (1, 2, 3, 3, 16, 4, 7, None, 4),  # two draft tokens, odd group, default split count
        (2, 2, 1, 1, 16, 4, 3, 2, 1),  # no draft (Tq = 1), one block per iteration
    ],
)
def test_sparse_attn_matches_reference(B, Hkv, G, Tq, D, BS, S, n_split, bpi):
    ks, vs, sid, ls, ll, q, ek, ev = make_case(B, Hkv, G, Tq, D, BS, S, seed=B * 100 + S)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hkv * G, Tq), float("nan"), device=q.device)
    sparse_attn(q, ks, vs, sid, ls, ll, ek, ev, return_lse=True, out=out, lse=lse, n_split=n_split, blocks_per_iter=bpi)
    ref, ref_lse = sparse_attn_ref(q, ks, vs, sid, ls, ll, ek, ev)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def dense_attention(q, keys, values, lens, extra_k, extra_v, sm_scale):
    """fp32 attention of q [B, Hq, Tq, D] over contiguous keys [B, Hkv, L, D] (first lens[b] valid); query t >= 1
    also sees extra[:t]."""
    B, Hq, Tq, D = q.shape
    Hkv = keys.shape[1]
    G = Hq // Hkv
    out = torch.empty(B, Hq, Tq, D)
    for b in range(B):
        L = int(lens[b])
        for h in range(Hq):
            kh = h // G
            for t in range(Tq):
                k = torch.cat([keys[b, kh, :L], extra_k[b, kh, :t]]).float() if t else keys[b, kh, :L].float()
                v = torch.cat([values[b, kh, :L], extra_v[b, kh, :t]]).float() if t else values[b, kh, :L].float()
                p = torch.softmax(q[b, h, t].float() @ k.T * sm_scale, -1)
                out[b, h, t] = p @ v
    return out


def slots_from_context(keys, values, lens, BS, top_k, g):
    """Scatter each row's full blocks into random slots (shuffled table order, -1 padding to top_k) and its
    partial last block into a local slot, as the executor would."""
    B, Hkv, L, D = keys.shape
    n_full = [int(n) // BS for n in lens]
    n_slots = B * Hkv * (top_k + 1) + 3
    ks = torch.randn(n_slots, BS, D, generator=g).to(keys.dtype)  # garbage everywhere else
    vs = torch.randn(n_slots, BS, D, generator=g).to(keys.dtype)
    free = torch.randperm(n_slots, generator=g).tolist()
    slot_ids = torch.full((B, Hkv, top_k), -1, dtype=torch.int32)
    local_slot = torch.empty(B, Hkv, dtype=torch.int32)
    for b in range(B):
        for h in range(Hkv):
            cols = torch.randperm(top_k, generator=g)[: n_full[b]]
            for blk, col in enumerate(cols.tolist()):
                s = free.pop()
                ks[s], vs[s] = keys[b, h, blk * BS : (blk + 1) * BS], values[b, h, blk * BS : (blk + 1) * BS]
                slot_ids[b, h, col] = s
            s = free.pop()
            n_loc = int(lens[b]) - n_full[b] * BS
            ks[s, :n_loc] = keys[b, h, n_full[b] * BS : int(lens[b])]
            vs[s, :n_loc] = values[b, h, n_full[b] * BS : int(lens[b])]
            local_slot[b, h] = s
    local_len = torch.tensor([int(n) - f * BS for n, f in zip(lens, n_full)], dtype=torch.int32)
    return ks, vs, slot_ids, local_slot, local_len


def test_sparse_covering_every_block_equals_dense():
    """With the top-K holding every full block (and the local block the rest), sparse == dense attention."""
    g = torch.Generator().manual_seed(7)
    B, Hkv, G, Tq, D, BS, top_k = 3, 2, 2, 2, 32, 4, 6
    lens = torch.tensor([23, 16, 9])  # partial local block, exactly full blocks (local empty), short context
    L = int(lens.max())
    keys = torch.randn(B, Hkv, L, D, generator=g).to(torch.bfloat16)
    values = torch.randn(B, Hkv, L, D, generator=g).to(torch.bfloat16)
    q = torch.randn(B, Hkv * G, Tq, D, generator=g).to(torch.bfloat16)
    ek = torch.randn(B, Hkv, Tq - 1, D, generator=g).to(torch.bfloat16)
    ev = torch.randn(B, Hkv, Tq - 1, D, generator=g).to(torch.bfloat16)
    ks, vs, sid, ls, ll = slots_from_context(keys, values, lens, BS, top_k, g)
    want = dense_attention(q, keys, values, lens, ek, ev, 1 / math.sqrt(D))
    for n_split in (1, 3):
        out = torch.full_like(q, float("nan"))
        sparse_attn(q, ks, vs, sid, ls, ll, ek, ev, out=out, n_split=n_split, blocks_per_iter=2)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_sparse_attn_rejects_bad_inputs():
    ks, vs, sid, ls, ll, q, ek, ev = make_case(1, 2, 2, 2, 16, 4, 3, device="cpu")
    with pytest.raises(AssertionError, match="slot_ids"):
        sparse_attn(q, ks, vs, sid.long(), ls, ll, ek, ev)
    with pytest.raises(AssertionError, match="extra_k"):
        sparse_attn(q, ks, vs, sid, ls, ll, ek[:, :1, :, :8].contiguous(), ev)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,n_split", [(64, None), (8, None), (8, 1)])
def test_sparse_attn_gpu_realistic(batch, n_split):
    """Qwen3-8B shapes: 32 q / 8 kv heads, D 128, block 16, top-K 128 + local, normal + draft query."""
    ks, vs, sid, ls, ll, q, ek, ev = make_case(batch, 8, 4, 2, 128, 16, 128, seed=batch)
    out = torch.full_like(q, float("nan"))
    sparse_attn(q, ks, vs, sid, ls, ll, ek, ev, out=out, n_split=n_split)
    ref, _ = sparse_attn_ref(q, ks, vs, sid, ls, ll, ek, ev)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_sparse_equals_dense_gpu_16k():
    g = torch.Generator().manual_seed(1)
    B, Hkv, G, Tq, D, BS = 2, 8, 4, 2, 128, 16
    lens = torch.tensor([16384 - 5, 4096 + 16])
    top_k = int(lens.max()) // BS
    keys = torch.randn(B, Hkv, int(lens.max()), D, generator=g).to(torch.bfloat16)
    values = torch.randn_like(keys)
    q = torch.randn(B, Hkv * G, Tq, D, generator=g).to(torch.bfloat16)
    ek, ev = torch.randn(2, B, Hkv, 1, D, generator=g).to(torch.bfloat16)
    ks, vs, sid, ls, ll = slots_from_context(keys, values, lens, BS, top_k, g)
    dev = torch.device("cuda")
    out = sparse_attn(*(t.to(dev) for t in (q, ks, vs, sid, ls, ll, ek, ev)))
    qf = q.float().to(dev)
    for b in range(B):
        L = int(lens[b])
        k = keys[b, :, :L].float().to(dev).repeat_interleave(G, 0)  # [Hq, L, D]
        v = values[b, :, :L].float().to(dev).repeat_interleave(G, 0)
        ke = torch.cat([k, ek[b].float().to(dev).repeat_interleave(G, 0)], 1)
        ve = torch.cat([v, ev[b].float().to(dev).repeat_interleave(G, 0)], 1)
        n = torch.softmax(qf[b, :, 0:1] @ k.transpose(1, 2) / math.sqrt(D), -1) @ v
        d = torch.softmax(qf[b, :, 1:2] @ ke.transpose(1, 2) / math.sqrt(D), -1) @ ve
        torch.testing.assert_close(out[b].float(), torch.cat([n, d], 1), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("S,n_split", [(0, 1), (3, 2)])
def test_sparse_attn_rows_without_keys(S, n_split):
    """A row with no resident block and an empty local block: the normal query gets out = 0 and lse = -inf (no
    NaN), the draft query still attends its own extra token."""
    g = torch.Generator().manual_seed(S)
    B, Hkv, G, Tq, D, BS = 2, 2, 2, 2, 16, 4
    ks = torch.randn(8, BS, D, generator=g).to(torch.bfloat16)
    vs = torch.randn(8, BS, D, generator=g).to(torch.bfloat16)
    sid = torch.full((B, Hkv, S), -1, dtype=torch.int32)
    ls = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    ll = torch.tensor([0, 2], dtype=torch.int32)
    q = torch.randn(B, Hkv * G, Tq, D, generator=g).to(torch.bfloat16)
    ek = torch.randn(B, Hkv, 1, D, generator=g).to(torch.bfloat16)
    ev = torch.randn(B, Hkv, 1, D, generator=g).to(torch.bfloat16)
    out, lse = sparse_attn(*(t.to(DEV) for t in (q, ks, vs, sid, ls, ll, ek, ev)), return_lse=True, n_split=n_split)
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(out[0, :, 0], torch.zeros(Hkv * G, D, dtype=out.dtype))
    assert torch.isneginf(lse[0, :, 0]).all()
    torch.testing.assert_close(out[0, :, 1], ev[0].repeat_interleave(G, 0)[:, 0])  # softmax over one key
    ref, ref_lse = sparse_attn_ref(q, ks, vs, sid, ls, ll, ek, ev)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
