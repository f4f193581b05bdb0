"""paged_attn vs its torch reference, and vs sparse_attn over the same tokens."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_kernels.paged_attn import paged_attn, paged_attn_ref
from oasis_kernels.sparse_attn import sparse_attn

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(B, Hkv, G, D, BS, max_pages, lens, seed, device=DEV):
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=g, device=device)
    n_pages = B * max_pages + 3
    k_cache = torch.randn(n_pages, Hkv, BS, D, **kw).to(torch.bfloat16)
    v_cache = torch.randn(n_pages, Hkv, BS, D, **kw).to(torch.bfloat16)
    block_table = torch.randperm(n_pages, **kw)[: B * max_pages].view(B, max_pages).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = torch.randn(B, Hkv * G, D, **kw).to(torch.bfloat16)
    return q, k_cache, v_cache, block_table, seq_lens


@pytest.mark.parametrize(
    "B,Hkv,G,D,BS,max_pages,lens,n_split,ppi",
    [
        (3, 2, 4, 16, 4, 7, [28, 1, 13], 1, 2),
        (2, 1, 2, 32, 8, 9, [72, 40], 3, 2),
        (2, 2, 3, 16, 4, 10, [37, 16], None, 4),
    ],
)
def test_paged_attn_matches_reference(B, Hkv, G, D, BS, max_pages, lens, n_split, ppi):
    q, kc, vc, bt, sl = make_case(B, Hkv, G, D, BS, max_pages, lens, seed=max_pages)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hkv * G), float("nan"), device=q.device)
    paged_attn(q, kc, vc, bt, sl, return_lse=True, out=out, lse=lse, n_split=n_split, pages_per_iter=ppi)
    ref, ref_lse = paged_attn_ref(q, kc, vc, bt, sl)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_paged_equals_sparse_over_the_same_pages():
    """A (page, head) of the paged cache is a slot: listing every full page plus the partial one as the local block
    makes sparse_attn compute the same attention as paged_attn."""
    B, Hkv, G, D, BS, max_pages = 2, 2, 2, 16, 4, 6
    lens = [22, 8]
    q, kc, vc, bt, sl = make_case(B, Hkv, G, D, BS, max_pages, lens, seed=11)
    k_slots = kc.reshape(-1, BS, D)  # slot = page * Hkv + head
    v_slots = vc.reshape(-1, BS, D)
    heads = torch.arange(Hkv, device=q.device, dtype=torch.int32)
    n_full = [n // BS for n in lens]
    slot_ids = torch.full((B, Hkv, max_pages), -1, dtype=torch.int32, device=q.device)
    local_slot = torch.full((B, Hkv), -1, dtype=torch.int32, device=q.device)
    for b in range(B):
        slot_ids[b, :, : n_full[b]] = bt[b, : n_full[b]][None, :] * Hkv + heads[:, None]
        if lens[b] % BS:
            local_slot[b] = bt[b, n_full[b]] * Hkv + heads
    local_len = torch.tensor([n % BS for n in lens], dtype=torch.int32, device=q.device)
    sparse = sparse_attn(q[:, :, None], k_slots, v_slots, slot_ids, local_slot, local_len, n_split=2)
    paged = paged_attn(q, kc, vc, bt, sl, n_split=2)
    torch.testing.assert_close(sparse[:, :, 0].float(), paged.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,context", [(32, 16384), (8, 16384), (4, 32768 - 3)])
def test_paged_attn_gpu_realistic(batch, context):
    max_pages = -(-context // 16)
    q, kc, vc, bt, sl = make_case(batch, 8, 4, 128, 16, max_pages, [context] * batch, seed=batch)
    out = paged_attn(q, kc, vc, bt, sl)
    ref, _ = paged_attn_ref(q[:2], kc, vc, bt[:2], sl[:2])
    torch.testing.assert_close(out[:2].float(), ref.float(), atol=2e-2, rtol=2e-2)
