"""oasis_kernels.spec_repair (the speculative step's repair prediction, one launch a layer) against its plain-torch
reference and the numpy reference (``oasis_core.spec_predict``): Triton's interpreter on CPU, small shapes.

Integer-valued queries and summaries make every score exact in any summation order, so the filled block's score
ties with candidate scores often (merge_block's tie rule), and the kernel must equal the references bit for bit."""

import numpy as np
import pytest
import torch

import oasis_kernels  # noqa: F401  (sets TRITON_INTERPRET without CUDA)
from oasis_core import spec_predict as sp
from oasis_core.block_scorers import split_sink
from oasis_kernels.block_score import block_score_ref
from oasis_kernels.block_scorers import block_score_any_ref
from oasis_kernels.spec_repair import spec_repair, spec_repair_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _case(seed, *, B=3, H=2, G=2, D=16, k=2, K=5, S=7, bs=4, nmax=12, integer=True, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    R, seats = B * H, B + 1
    lanes = torch.randperm(seats, generator=g)[:B]
    n = torch.randint(0, k + 1, (B,), generator=g)
    # positions near a block's end (runs fill blocks) and elsewhere; a block 0 fill (the +sink rule) for lane 0
    pos = torch.randint(0, (nmax - 2) * bs, (B,), generator=g)
    pos[1::2] = (pos[1::2] // bs) * bs + bs - 2
    pos[0] = bs - 2
    n[1] = n[1].clamp(min=1)  # lane 1 fills a block (not block 0)
    if integer:
        q = torch.randint(-1, 2, (B, k + 1, H * G, D), generator=g).float()
        a = torch.randint(-1, 2, (seats, H, nmax, D), generator=g).float()
        b = a + torch.randint(0, 2, (seats, H, nmax, D), generator=g).float()
    else:
        q = torch.randn(B, k + 1, H * G, D, generator=g)
        a = torch.randn(seats, H, nmax, D, generator=g)
        b = a.abs() + torch.rand(seats, H, nmax, D, generator=g)
    ids = torch.full((k, R, K), -1, dtype=torch.int64)
    vals = torch.full((k, R, K), float("-inf"))
    for s in range(k):
        for r in range(R):
            m = int(torch.randint(0, K + 1, (1,), generator=g)) if r % 3 else K  # full rows and short ones
            ids[s, r, :m] = torch.randperm(nmax, generator=g)[:m]
            v = torch.randint(-4, 5, (m,), generator=g).float() if integer else torch.randn(m, generator=g)
            vals[s, r, :m] = torch.sort(v, descending=True).values
    # p_hat: a candidate with some entries changed and short rows; resident: a mix of blocks, empty slots anywhere
    p_hat = ids[torch.randint(0, k, (R,), generator=g), torch.arange(R)].clone()
    swap = torch.rand(R, K, generator=g) < 0.4
    p_hat[swap] = torch.randint(0, nmax, (int(swap.sum()),), generator=g)
    resident = torch.full((seats * H, S), -1, dtype=torch.int64)
    for i in range(seats * H):
        m = int(torch.randint(0, S + 1, (1,), generator=g))
        resident[i, torch.randperm(S, generator=g)[:m]] = torch.randperm(max(nmax, S), generator=g)[:m]
    rows = (lanes[:, None] * H + torch.arange(H)).reshape(-1)
    args = [ids, vals, p_hat, resident, rows, n, pos, lanes, q.to(dtype), a.to(dtype), b.to(dtype)]
    return [t.to(DEV) for t in args]


def _new_val(args, bs, scorer):
    """The filled block's score a row, numpy [R], from a full rescoring of the accepted query against every block of
    its seat (what merge_block's exactness assumes), +inf by the +sink rule."""
    _, _, p_hat, _, _, n, pos, lanes, q, a, b = [t.cpu() for t in args]
    B, nq = q.shape[:2]
    R, H = p_hat.shape[0], a.shape[1]
    s = sp.query_index(n.numpy(), nq - 1)
    b_new = (pos.numpy() + 1) // bs
    qt = q[torch.arange(B), torch.as_tensor(s)]
    nb = torch.as_tensor(b_new + 2, dtype=torch.int32)  # block b_new eligible, nothing past it
    base, sink = split_sink(scorer)
    if base == "minmax":
        full = block_score_ref(qt, a, b, nb, lanes.to(torch.int32))
    else:
        full = block_score_any_ref(qt, a, b, nb, base, lanes.to(torch.int32))
    new_val = full[torch.arange(B), :, torch.as_tensor(b_new)].reshape(R).numpy()
    if sink:
        new_val = np.where(np.repeat(b_new, H) == 0, np.inf, new_val).astype(np.float32)
    return new_val


def _with_ties(args, new_val, seed):
    """Most rows' candidates (each query index) given one score equal to the row's filled-block score."""
    ids, vals = args[0].cpu(), args[1].cpu().clone()
    g = torch.Generator().manual_seed(seed)
    for s in range(ids.shape[0]):
        for r in range(ids.shape[1]):
            m = int((ids[s, r] >= 0).sum())
            if m and np.isfinite(new_val[r]) and float(torch.rand(1, generator=g)) < 0.7:
                vals[s, r, int(torch.randint(0, m, (1,), generator=g))] = float(new_val[r])
                vals[s, r, :m] = torch.sort(vals[s, r, :m], descending=True).values
    return [args[0], vals.to(args[1].device), *args[2:]]


def _numpy_reference(args, bs, scorer):
    """The repair from oasis_core.spec_predict on numpy arrays."""
    ids, vals, p_hat, resident, rows, n, pos, lanes, q, a, b = [t.cpu() for t in args]
    nq = q.shape[1]
    R, H = p_hat.shape[0], a.shape[1]
    s = sp.query_index(n.numpy(), nq - 1)
    b_new_r = np.repeat((pos.numpy() + 1) // bs, H)
    new_val = _new_val(args, bs, scorer)
    pick = (np.repeat(s - 1, H), np.arange(R))
    add = np.repeat(sp.fills(pos.numpy(), n.numpy(), bs), H)
    p_true, _ = sp.merge_block(ids.numpy()[pick], vals.numpy()[pick], b_new_r, new_val, add)
    ties = int((add[:, None] & (ids.numpy()[pick] >= 0) & (vals.numpy()[pick] == new_val[:, None])).sum())
    return sp.repair_pred(p_true, p_hat.numpy(), resident.numpy()[rows.numpy()]), p_true, ties


@pytest.mark.parametrize(
    "scorer,k,K,S,G",
    [
        ("minmax", 1, 5, 7, 2),
        ("minmax", 3, 8, 5, 1),
        ("minmax_sum+sink", 2, 6, 12, 4),
        ("mean", 2, 4, 9, 2),
        ("mean+sink", 3, 7, 3, 3),
    ],
)
@pytest.mark.parametrize("seed", range(3))
def test_equals_the_references_with_ties(scorer, k, K, S, G, seed):
    bs = 4
    args = _case(seed * 31 + k, k=k, K=K, S=S, G=G, bs=bs)
    args = _with_ties(args, _new_val(args, bs, scorer), seed)
    pt = torch.empty(args[2].shape, dtype=torch.int64, device=DEV)
    got = spec_repair(*args, bs, scorer, p_true_out=pt)
    want, want_true = spec_repair_ref(*args, bs, scorer)
    assert torch.equal(got, want) and torch.equal(pt, want_true)
    np_out, np_true, ties = _numpy_reference(args, bs, scorer)
    np.testing.assert_array_equal(got.cpu().numpy(), np_out)
    np.testing.assert_array_equal(pt.cpu().numpy(), np_true)
    assert ties > 0  # the filled block tied a candidate somewhere: the tie rule was exercised


def test_gauss_and_fp32():
    """The log-sum-exp scorer on continuous values (no exact ties), and fp32 inputs (the interpreter's CPU runs)."""
    bs = 4
    for scorer, dtype in (("gauss", torch.bfloat16), ("gauss+sink", torch.float32), ("minmax_sum", torch.float32)):
        args = _case(5, k=2, K=6, S=8, integer=False, dtype=dtype)
        if dtype == torch.float32 and DEV == "cuda":
            continue  # CUDA takes bf16 / fp16 only (tensor-core dots, as block_score)
        got = spec_repair(*args, bs, scorer)
        want, _ = spec_repair_ref(*args, bs, scorer)
        assert torch.equal(got, want), scorer


def test_given_sets_and_every_row_kind():
    """Given sets (replayed / synthetic selections): P_true is the given set, only repair_pred runs; -1 entries
    anywhere in it stay (the stable partition puts them after the kept ones)."""
    bs = 4
    args = _case(11, k=2, K=6, S=6)
    R, K = args[2].shape
    g = torch.Generator().manual_seed(4)
    given = torch.randint(-1, 12, (R, K), generator=g).to(DEV)
    given[0] = args[2][0]  # P_true == P_hat: every entry resident or not, nothing of P_hat dropped if resident
    pt = torch.empty(R, K, dtype=torch.int64, device=DEV)
    got = spec_repair(*args, bs, "minmax", given=given, p_true_out=pt)
    want, want_true = spec_repair_ref(*args, bs, "minmax", given=given)
    assert torch.equal(got, want) and torch.equal(pt, given)
    np.testing.assert_array_equal(
        got.cpu().numpy(),
        sp.repair_pred(given.cpu().numpy(), args[2].cpu().numpy(), args[3].cpu().numpy()[args[4].cpu().numpy()]),
    )


def test_rows_that_fill_nothing_keep_their_candidate():
    """n = 0 at a block's start: no fill, P_true is the candidate of index 1; with an empty resident table and p_hat
    disjoint from it, the output is the candidate itself."""
    bs = 4
    args = _case(2, k=2, K=5, S=7)
    ids, vals, p_hat, resident, rows, n, pos, lanes = args[:8]
    n.zero_()
    pos.copy_(torch.tensor([1, 5, 9]))  # (pos + 1) % bs = 2: a run of 0 drafts fills nothing
    p_hat.fill_(-1)
    resident.fill_(-1)
    got = spec_repair(*args, bs, "minmax")
    assert torch.equal(got, ids[0])


@pytest.mark.gpu
@pytest.mark.parametrize("scorer", ["minmax_sum+sink", "minmax"])
def test_gpu_realistic_shape(scorer):
    """The Qwen3-8B bench's shape (44 lanes x 8 KV heads, G = 4, D = 128, K = S = 128, 16K tokens in blocks of 16),
    compiled: equal to the references (integer-valued inputs: every score exact in any order, ties injected)."""
    if DEV != "cuda":
        pytest.skip("needs CUDA (run on the GPU machine with `pytest -m gpu`)")
    bs = 16
    args = _case(7, B=44, H=8, G=4, D=128, k=1, K=128, S=128, bs=bs, nmax=1024)
    args = _with_ties(args, _new_val(args, bs, scorer), 7)
    pt = torch.empty(args[2].shape, dtype=torch.int64, device=DEV)
    got = spec_repair(*args, bs, scorer, p_true_out=pt)
    want, want_true = spec_repair_ref(*args, bs, scorer)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(pt, want_true)
    np_out, _, ties = _numpy_reference(args, bs, scorer)
    np.testing.assert_array_equal(got.cpu().numpy(), np_out)
    assert ties > 0
