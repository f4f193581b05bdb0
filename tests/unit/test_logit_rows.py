"""``LogitRows`` (the runner's per-request logits, made on access) equals the eager dict it replaced."""

import pytest
import torch

from oasis_exec.runner.logit_rows import LogitRows


def test_rows_equal_the_eager_views_and_merge_like_a_dict():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 2, 7, generator=g)
    ids = [11, 3, 42, 8, 5]
    n_acc = [0, 1, 1, 0, 1]
    last = LogitRows(ids, lambda i: logits[i, n_acc[i]])
    seq = LogitRows(ids, lambda i: logits[i, : n_acc[i] + 1])
    assert list(last) == ids and len(seq) == 5
    for i, rid in enumerate(ids):
        assert torch.equal(last[rid], logits[i, n_acc[i]])
        assert seq[rid].shape == (n_acc[i] + 1, 7) and torch.equal(seq[rid], logits[i, : n_acc[i] + 1])
    merged = {**{99: torch.zeros(7)}, **last}  # the engine's merge with a prefill's first logits
    assert set(merged) == {99, *ids} and torch.equal(merged[42], logits[2, 1])
    with pytest.raises(KeyError):
        last[7]
