"""quality.scorer_stats with a per-token scorer: with every channel kept it ranks blocks by their true next-query
attention mass, so its mass is the best-K ceiling and its recall 1 (the harness path gemma_chunked.py measures).
Block 0 holds a sink key every query attends most (the scorer always keeps block 0, as ``+sink``)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from oasis_core.token_scorer import channel_basis  # noqa: E402
from oasis_exec.tools.quality import metrics  # noqa: E402
from oasis_exec.tools.quality.scorer_stats import LayerScorers  # noqa: E402


def test_full_basis_reaches_the_ceiling_and_a_narrow_one_less():
    g = torch.Generator().manual_seed(0)
    t, hkv, hq, d, bs, p = 256, 2, 4, 16, 8, 5
    base = torch.randn(d, generator=g)
    keys = torch.randn(t, hkv, d, generator=g) * 2
    keys[:bs] += 3 * base  # the sink block
    q = base + torch.randn(p + 1, hq, d, generator=g)
    ts = torch.arange(t - 2 - p, t - 2)
    mass = metrics.block_mass(metrics.attention_probs(q[1:], keys, ts + 2), bs, hkv)
    full = torch.tensor(channel_basis(np.tile(np.arange(d), (hkv, 1)), d, np.float32))
    narrow = torch.tensor(channel_basis(np.tile(np.array([0, 8]), (hkv, 1)), d, np.float32))
    ls = LayerScorers(["minmax"], keys, bs, bases={"tokens:all": full, "tokens:2": narrow})
    st_all, _, _ = ls.stats("tokens:all", 6, q[:-1], q[1:], mass, ts)
    st_two, _, _ = ls.stats("tokens:2", 6, q[:-1], q[1:], mass, ts)
    assert st_all["mass"] == pytest.approx(st_all["best"], abs=1e-6) and st_all["recall"] == 1.0
    assert st_two["mass"] < st_all["mass"] and st_two["recall"] < 1.0
