"""topk_select (one launch) against oasis_core.scoring.topk_blocks, exactly: random scores, ties, -0.0 and +0.0,
eligible -inf, rows with fewer eligible blocks than k, k above the row length."""

import pytest
import torch

import oasis_kernels  # noqa: F401  (Triton interpreter without CUDA)
from oasis_kernels.topk_select import topk_select, topk_select_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def case(B, H, N, seed, ties=False, short=None):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B * H, N, generator=g)
    if ties:  # few distinct values, both zeros, and -inf among eligible blocks
        s = torch.randint(-2, 3, (B * H, N), generator=g).float()
        s[s == 0] = torch.where(torch.rand(int((s == 0).sum()), generator=g) < 0.5, -0.0, 0.0)
        s[:, 1] = float("-inf")
    nb = torch.randint(1, N + 1, (B,), generator=g, dtype=torch.int32)
    nb[0] = N
    if short is not None:  # the last request has fewer eligible blocks than k
        nb[-1] = short
    return s.to(DEV), nb.to(DEV)


@pytest.mark.parametrize(
    "B,H,N,k,ties",
    [
        (3, 2, 37, 8, False),
        (2, 4, 64, 16, True),
        (1, 1, 5, 8, False),
        (4, 2, 100, 100, True),
        (2, 3, 130, 7, True),
        (2, 1, 1100, 1030, True),
    ],
)
def test_topk_select_equals_topk_blocks(B, H, N, k, ties):
    s, nb = case(B, H, N, seed=N + k, ties=ties, short=max(1, min(N, k // 2)))
    got = topk_select(s, k, nb, heads=H)
    ref = topk_select_ref(s, k, nb, heads=H)
    assert got.dtype == torch.int64 and got.shape == (B * H, k)
    assert torch.equal(got.cpu(), ref.cpu())
    assert (got[-H:] == -1).any()  # the short request's rows are padded


def test_topk_select_takes_a_non_contiguous_row_stride_and_bf16():
    s, nb = case(2, 2, 48, seed=1)
    wide = torch.full((4, 64), float("nan"), device=DEV)
    wide[:, :48] = s
    assert torch.equal(topk_select(wide[:, :48], 6, nb, heads=2).cpu(), topk_select_ref(s, 6, nb, heads=2).cpu())
    b = s.to(torch.bfloat16)
    assert torch.equal(topk_select(b, 6, nb, heads=2).cpu(), topk_select_ref(b, 6, nb, heads=2).cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the engine's shapes are too slow for the interpreter")
@pytest.mark.parametrize("B,N,ties", [(44, 1024, False), (22, 2048, True), (16, 1024, True)])
def test_topk_select_at_the_engines_shapes(B, N, ties):
    """16K and 32K contexts of 16-token blocks, 8 KV heads, top-K 128: the rows the engine sorts each layer."""
    s, nb = case(B, 8, N, seed=B + N, ties=ties, short=64)
    assert torch.equal(topk_select(s, 128, nb, heads=8).cpu(), topk_select_ref(s, 128, nb, heads=8).cpu())
