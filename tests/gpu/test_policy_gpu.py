"""On CUDA: the scoring and selection policy path runs without a single host synchronisation and matches numpy."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_cuda_policy_path_is_sync_free_and_matches_numpy():
    torch = pytest.importorskip("torch")
    from oasis_core.scoring import build_summaries, score_blocks, topk_blocks
    from oasis_core.selection import initial_plan, plan_step

    rng = np.random.default_rng(0)
    b, hq, hkv, t, d, k = 4, 32, 8, 1000, 128, 16
    keys = rng.integers(-3, 4, (b, hkv, t, d)).astype(np.float32)
    q = rng.integers(-3, 4, (b, hq, d)).astype(np.float32)
    dev = torch.device("cuda")
    keys_t, q_t = torch.from_numpy(keys).to(dev), torch.from_numpy(q).to(dev)
    n_blocks_t = torch.full((b * hkv,), 63, device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        kmin, kmax = build_summaries(keys_t, 16)
        pred = topk_blocks(score_blocks(q_t, kmin, kmax).reshape(b * hkv, -1), k, n_blocks_t)
        first = initial_plan(pred)
        plan = plan_step(first.resident, first.last_sel, torch.roll(pred, 3, dims=0), 3, step=1, max_cap=3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    kmin_n, kmax_n = build_summaries(keys, 16)
    pred_n = topk_blocks(score_blocks(q, kmin_n, kmax_n).reshape(b * hkv, -1), k, np.full(b * hkv, 63))
    np.testing.assert_array_equal(pred.cpu().numpy(), pred_n)
    first_n = initial_plan(pred_n)
    plan_n = plan_step(first_n.resident, first_n.last_sel, np.roll(pred_n, 3, axis=0), 3, step=1, max_cap=3)
    for f in ("fetch_block", "fetch_slot", "n_fetch", "n_missing", "resident", "last_sel"):
        np.testing.assert_array_equal(getattr(plan, f).cpu().numpy(), getattr(plan_n, f), err_msg=f)
