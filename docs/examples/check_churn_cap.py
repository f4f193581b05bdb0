"""Unit check of ChurnCap: two steps worked by hand, then numpy == torch on random inputs, 0 <= cap <= max_cap."""

import numpy as np
import torch

from oasis_core.fetchcap import CapContext, get_policy, state_array

p = get_policy("churn:1.5")  # found through OASIS_POLICY_MODULES=docs/examples/churn_cap.py
K = 128  # floor ratio_cap(0.02, 128) = 3, ceiling ratio_cap(0.25, 128) = 32


def ctx(n_missing, row_state):
    return CapContext(step=1, top_k=K, rows=len(n_missing), n_missing=n_missing, row_state=row_state)


st = state_array(p.row_state_init(K), 3)
assert p.cap(ctx(np.array([0, 10, 100]), st)).tolist() == [3, 5, 32]  # ema [0, 3, 30]: 1.5 ema = [0, 4.5, 45]
assert p.cap(ctx(np.array([0, 10, 100]), st)).tolist() == [3, 8, 32]  # ema [0, 5.1, 51]: [0, 7.65, 76.5]

rng = np.random.default_rng(0)
R = 16
s_np, s_t = state_array(p.row_state_init(K), R), state_array(p.row_state_init(K), R, like=torch.empty(0))
for _ in range(50):
    n = rng.integers(0, K + 1, size=R)
    a, b = p.cap(ctx(n, s_np)), p.cap(ctx(torch.from_numpy(n), s_t))
    assert b.dtype == torch.int64 and b.tolist() == a.tolist() and 0 <= a.min() and a.max() <= p.max_cap(K)
    assert np.array_equal(s_t.numpy(), s_np)  # the state too: the same float64 operations in the same order
print("ChurnCap: ok")
