"""HeadMapping bookkeeping: allocation, release, applying plans, lookup, invariants and misuse errors."""

import numpy as np
import pytest

from oasis_core.mapping import HeadMapping, MappingError
from oasis_core.selection import initial_plan, plan_step


def test_rows_are_contiguous_layer_major_and_reused_lowest_first():
    m = HeadMapping(max_requests=3, n_layers=2, n_kv_heads=4, slots=3)
    assert m.allocate("a") == range(0, 8)
    assert m.allocate("b") == range(8, 16)
    assert m.row("b", layer=1, head=2) == 8 + 4 + 2
    assert m.release("a") == range(0, 8)
    assert m.allocate("c") == range(0, 8)  # the freed range comes back first
    assert m.allocated_rows().tolist() == list(range(16))
    assert m.n_free == 1


def test_misuse_errors():
    m = HeadMapping(max_requests=1, n_layers=1, n_kv_heads=1, slots=2)
    m.allocate(7)
    with pytest.raises(MappingError, match="request 7 already holds rows"):
        m.allocate(7)
    with pytest.raises(MappingError, match="out of capacity"):
        m.allocate(8)
    with pytest.raises(MappingError, match="unknown request 8"):
        m.release(8)
    with pytest.raises(MappingError, match="layer 1 / head 0 out of range"):
        m.row(7, 1, 0)
    with pytest.raises(MappingError, match="HeadMapping.slots"):
        HeadMapping(1, 1, 1, 0)
    m.release(7)
    with pytest.raises(MappingError, match="unknown request 7"):
        m.rows(7)
    with pytest.raises(MappingError, match="budget"):
        m.allocate(1, budget=3)


def test_apply_lookup_and_release():
    m = HeadMapping(max_requests=2, n_layers=1, n_kv_heads=2, slots=3)
    rows = m.allocate("r")
    p = initial_plan(np.array([[10, 11, 12], [20, -1, -1]]), step=0)
    m.apply(p, rows)
    assert m.table[rows.start : rows.stop].tolist() == [[10, 11, 12], [20, -1, -1]]
    assert m.lookup([0, 0, 1, 1], [12, 20, 20, -1]).tolist() == [2, -1, 0, -1]
    p2 = plan_step(m.table[0:2], m.last_sel[0:2], np.array([[13, 10, 11], [21, 20, 22]]), 1, step=1, max_cap=1)
    m.apply(p2, rows)
    assert m.table[0:2].tolist() == [[10, 11, 13], [20, 21, -1]]
    assert m.last_sel[0:2].tolist() == [[1, 1, 1], [1, 1, -1]]
    m.check()
    m.release("r")
    assert (m.table == -1).all() and m.occupancy().sum() == 0


def test_apply_rejects_unallocated_rows_and_row_count_mismatch():
    m = HeadMapping(max_requests=2, n_layers=1, n_kv_heads=1, slots=2)
    m.allocate("a")
    p = initial_plan(np.array([[1, 2]]))
    with pytest.raises(MappingError, match="not allocated"):
        m.apply(p, [1])
    with pytest.raises(MappingError, match="plan has 1 rows, 2 mapping rows"):
        m.apply(p)


def test_apply_accepts_torch_plans():
    torch = pytest.importorskip("torch")
    m = HeadMapping(max_requests=1, n_layers=1, n_kv_heads=1, slots=2)
    m.allocate(0)
    m.apply(initial_plan(torch.tensor([[4, 5]])), range(0, 1))
    assert m.table.tolist() == [[4, 5]]


def test_check_catches_each_broken_invariant():
    m = HeadMapping(max_requests=2, n_layers=1, n_kv_heads=1, slots=3)
    m.allocate("a", budget=2)
    m.check()
    m.table[0] = [5, 6, 5]
    with pytest.raises(AssertionError, match="row 0 holds 3 blocks, budget 2"):
        m.check()
    m.table[0] = [5, -1, 5]
    with pytest.raises(AssertionError, match="host block 5 in two slots"):
        m.check()
    m.table[0] = [5, -1, -1]
    m.table[1] = [1, -1, -1]
    with pytest.raises(AssertionError, match="free row 1 holds blocks"):
        m.check()
