"""Paper Algorithm 2 (capped incremental selection): hand-worked cases, invariants on random inputs, numpy == torch."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oasis_core.mapping import HeadMapping
from oasis_core.selection import StepPlan, initial_plan, plan_step

torch = pytest.importorskip("torch")


def arr(x):
    return np.array(x, dtype=np.int64)


def as_np(plan: StepPlan) -> dict:
    return {k: np.asarray(getattr(plan, k)) for k in StepPlan.__dataclass_fields__}


# ---------------------------------------------------------------- exact cases worked out by hand


def test_keep_admit_evict_in_order():
    # slots:      0   1   2   3   4
    resident = arr([[10, 11, 12, 13, 14]])
    last_sel = arr([[5, 2, 7, 2, 9]])
    pred = arr([[13, 20, 10, 21, 22]])  # keep 13 (slot 3) and 10 (slot 0); missing 20, 21, 22 in this order
    p = plan_step(resident, last_sel, pred, cap=5, step=10, max_cap=5)
    # victims 11 (slot 1, ls 2), 12 (slot 2, ls 7), 14 (slot 4, ls 9); slots 1 and 3 tie at ls 2 but 3 is kept.
    assert p.fetch_block.tolist() == [[20, 21, 22, -1, -1]]
    assert p.fetch_slot.tolist() == [[1, 2, 4, -1, -1]]
    assert p.n_fetch.tolist() == [3] and p.n_missing.tolist() == [3] and p.n_kept.tolist() == [2]
    assert p.resident.tolist() == [[10, 20, 21, 13, 22]]
    assert p.last_sel.tolist() == [[10, 10, 10, 10, 10]]


def test_lru_ties_go_to_lower_slot_and_empty_slots_come_first():
    resident = arr([[30, -1, 31, 32, -1, 33]])
    last_sel = arr([[4, 8, 4, 1, 0, 4]])  # last_sel of empty slots is ignored
    pred = arr([[40, 41, 42, 43, 44, 45]])  # nothing kept, six missing
    p = plan_step(resident, last_sel, pred, cap=6, step=9, max_cap=6)
    # empty slots 1, 4; then slot 3 (ls 1); then ls 4 ties: slots 0, 2, 5
    assert p.fetch_slot.tolist() == [[1, 4, 3, 0, 2, 5]]
    assert p.fetch_block.tolist() == [[40, 41, 42, 43, 44, 45]]
    assert p.resident.tolist() == [[43, 40, 44, 42, 41, 45]]


def test_cap_smaller_than_missing_fetches_best_first_and_leaves_the_rest():
    resident = arr([[1, 2, 3, 4]])
    last_sel = arr([[3, 0, 2, 1]])
    pred = arr([[7, 1, 8, 9]])  # keep 1; missing 7, 8, 9
    p = plan_step(resident, last_sel, pred, cap=2, step=5, max_cap=3)
    assert p.fetch_block.tolist() == [[7, 8, -1]]
    assert p.fetch_slot.tolist() == [[1, 3, -1]]  # ls 0 then ls 1
    assert p.n_fetch.tolist() == [2] and p.n_missing.tolist() == [3]
    assert p.resident.tolist() == [[1, 7, 3, 8]]
    assert p.last_sel.tolist() == [[5, 5, 2, 5]]  # slot 2 (block 3) is a victim not replaced: keeps ls 2


def test_cap_larger_than_victims_is_limited_by_victims():
    # K = 4 predicted, only 3 slots: 2 kept, 1 victim, 2 missing.
    resident = arr([[5, 6, 7]])
    last_sel = arr([[0, 0, 0]])
    pred = arr([[5, 8, 6, 9]])
    p = plan_step(resident, last_sel, pred, cap=4, step=1, max_cap=4)
    assert p.fetch_block.tolist() == [[8, -1, -1, -1]]
    assert p.fetch_slot.tolist() == [[2, -1, -1, -1]]
    assert p.n_fetch.tolist() == [1] and p.n_missing.tolist() == [2] and p.n_kept.tolist() == [2]
    assert p.resident.tolist() == [[5, 6, 8]]


def test_padded_predictions_and_per_row_caps():
    resident = arr([[1, 2, -1], [4, 5, 6], [-1, -1, -1]])
    last_sel = arr([[1, 0, -1], [2, 3, 1], [-1, -1, -1]])
    pred = arr([[2, 3, -1], [-1, -1, -1], [9, -1, -1]])
    p = plan_step(resident, last_sel, pred, cap=arr([1, 2, 0]), step=4, max_cap=2)
    # row 0: keep 2, missing 3 -> the empty slot 2. row 1: nothing predicted, nothing moves.
    # row 2: cap 0 -> 9 is missing but not fetched.
    assert p.fetch_block.tolist() == [[3, -1], [-1, -1], [-1, -1]]
    assert p.fetch_slot.tolist() == [[2, -1], [-1, -1], [-1, -1]]
    assert p.n_fetch.tolist() == [1, 0, 0]
    assert p.n_missing.tolist() == [1, 0, 1]
    assert p.n_kept.tolist() == [1, 0, 0]
    assert p.resident.tolist() == [[1, 2, 3], [4, 5, 6], [-1, -1, -1]]
    assert p.last_sel.tolist() == [[1, 4, 4], [2, 3, 1], [-1, -1, -1]]


def test_array_cap_is_clipped_to_max_cap_and_zero():
    resident = arr([[-1, -1, -1], [-1, -1, -1]])
    pred = arr([[1, 2, 3], [4, 5, 6]])
    p = plan_step(resident, resident, pred, cap=arr([9, -3]), step=0, max_cap=2)
    assert p.n_fetch.tolist() == [2, 0]
    assert p.fetch_block.tolist() == [[1, 2], [-1, -1]]


def test_int_cap_out_of_range_is_an_error():
    r = arr([[-1, -1]])
    with pytest.raises(ValueError, match="cap"):
        plan_step(r, r, arr([[1, 2]]), cap=3, step=0, max_cap=2)


def test_two_steps_lru_follows_last_selection():
    # Step 1 selects {1, 2}; step 2 selects {2, 3}: block 1 (selected at 1) goes before block 4 (selected at 0)?
    # No: LRU evicts the least recently selected, so block 4 (ls 0) goes first.
    resident = arr([[1, 2, 4]])
    last_sel = arr([[0, 0, 0]])
    p1 = plan_step(resident, last_sel, arr([[1, 2]]), cap=1, step=1, max_cap=1)
    assert p1.n_fetch.tolist() == [0] and p1.last_sel.tolist() == [[1, 1, 0]]
    p2 = plan_step(p1.resident, p1.last_sel, arr([[2, 3]]), cap=1, step=2, max_cap=1)
    assert p2.fetch_block.tolist() == [[3]] and p2.fetch_slot.tolist() == [[2]]
    assert p2.resident.tolist() == [[1, 2, 3]] and p2.last_sel.tolist() == [[1, 2, 2]]


def test_initial_plan_fills_empty_slots_in_prediction_order():
    p = initial_plan(arr([[8, 3, 5], [2, -1, -1]]), step=0)
    assert p.fetch_block.tolist() == [[8, 3, 5], [2, -1, -1]]
    assert p.fetch_slot.tolist() == [[0, 1, 2], [0, -1, -1]]
    assert p.resident.tolist() == [[8, 3, 5], [2, -1, -1]]
    assert p.last_sel.tolist() == [[0, 0, 0], [0, -1, -1]]


def test_inputs_are_not_modified():
    resident = arr([[1, 2]])
    last_sel = arr([[0, 0]])
    plan_step(resident, last_sel, arr([[3, 1]]), cap=1, step=7, max_cap=1)
    assert resident.tolist() == [[1, 2]] and last_sel.tolist() == [[0, 0]]


# ---------------------------------------------------------------- reference and random inputs


def reference_step(resident, last_sel, pred, cap, step):
    """Algorithm 2 row by row in plain Python: the definition the vectorised code must match."""
    out = []
    for res, ls, p, c in zip(resident.tolist(), last_sel.tolist(), pred.tolist(), cap):
        pset = {b for b in p if b >= 0}
        rset = {b for b in res if b >= 0}
        missing = [b for b in p if b >= 0 and b not in rset]
        victims = [s for s in range(len(res)) if res[s] not in pset]  # empty slots (-1) are never in pset
        victims.sort(key=lambda s: (res[s] >= 0, ls[s] if res[s] >= 0 else 0, s))
        admit = min(len(missing), c, len(victims))
        new_res, new_ls = list(res), [step if res[s] in pset else ls[s] for s in range(len(res))]
        for b, s in zip(missing[:admit], victims[:admit]):
            new_res[s], new_ls[s] = b, step
        out.append((missing[:admit], victims[:admit], len(missing), new_res, new_ls))
    return out


def random_state(rng, r, s, k, universe, lsmax):
    resident = np.full((r, s), -1, dtype=np.int64)
    pred = np.full((r, k), -1, dtype=np.int64)
    for i in range(r):
        n_res = rng.integers(0, min(s, universe) + 1)
        slots = rng.permutation(s)[:n_res]
        resident[i, slots] = rng.permutation(universe)[:n_res]
        n_pred = rng.integers(0, min(k, universe) + 1)
        pred[i, :n_pred] = rng.permutation(universe)[:n_pred]
    last_sel = rng.integers(-1, lsmax + 1, size=(r, s))  # a small range: many LRU ties
    return resident, last_sel, pred


shapes = st.tuples(st.integers(1, 6), st.integers(1, 8), st.integers(1, 8), st.integers(1, 14))
fast = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), max_cap=st.integers(0, 8), per_row=st.booleans())
def test_matches_reference_and_invariants(shape, seed, max_cap, per_row):
    r, s, k, universe = shape
    rng = np.random.default_rng(seed)
    resident, last_sel, pred = random_state(rng, r, s, k, universe, lsmax=3)
    cap = rng.integers(0, max_cap + 1, size=r) if per_row else np.full(r, rng.integers(0, max_cap + 1))
    p = plan_step(resident, last_sel, pred, cap if per_row else int(cap[0]), step=5, max_cap=max_cap)
    assert p.fetch_block.shape == (r, max_cap) and p.fetch_slot.shape == (r, max_cap)
    ref = reference_step(resident, last_sel, pred, cap.tolist(), step=5)
    for i, (blocks, slots, n_missing, new_res, new_ls) in enumerate(ref):
        n = len(blocks)
        assert p.n_fetch[i] == n and p.n_missing[i] == n_missing
        assert p.fetch_block[i].tolist() == blocks + [-1] * (max_cap - n)
        assert p.fetch_slot[i].tolist() == slots + [-1] * (max_cap - n)
        assert p.resident[i].tolist() == new_res and p.last_sel[i].tolist() == new_ls
        # invariants, stated directly
        occupied = p.resident[i][p.resident[i] >= 0]
        assert len(set(occupied.tolist())) == occupied.size <= s  # distinct, within the slot budget
        assert n <= cap[i]  # transfers within the cap
        kept_blocks = set(resident[i].tolist()) & set(pred[i].tolist()) - {-1}
        assert not kept_blocks & set(blocks)  # kept blocks never transferred
        assert not {resident[i, sl] for sl in slots} & kept_blocks  # kept blocks never evicted
        # victims are the least recently selected: every evicted occupied slot is no more recent than every
        # occupied victim slot left in place, and no occupied slot is taken while an empty one is left.
        occ_victims = [sl for sl in range(s) if resident[i, sl] >= 0 and resident[i, sl] not in kept_blocks]
        evicted = [sl for sl in slots if resident[i, sl] >= 0]
        spared = [sl for sl in occ_victims if sl not in slots]
        empty_unused = [sl for sl in range(s) if resident[i, sl] < 0 and sl not in slots]
        if evicted:
            assert not empty_unused
            assert max(last_sel[i, evicted]) <= min(last_sel[i, spared], default=lsmax_plus)


lsmax_plus = 99


@fast
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), max_cap=st.integers(0, 8))
def test_numpy_and_torch_give_identical_plans(shape, seed, max_cap):
    r, s, k, universe = shape
    rng = np.random.default_rng(seed)
    resident, last_sel, pred = random_state(rng, r, s, k, universe, lsmax=2)
    cap = rng.integers(0, max_cap + 1, size=r)
    a = as_np(plan_step(resident, last_sel, pred, cap, step=3, max_cap=max_cap))
    t = plan_step(
        torch.from_numpy(resident),
        torch.from_numpy(last_sel),
        torch.from_numpy(pred),
        torch.from_numpy(cap),
        step=3,
        max_cap=max_cap,
    )
    assert all(isinstance(getattr(t, f), torch.Tensor) for f in a)
    b = as_np(t)
    for f in a:
        assert a[f].dtype == b[f].dtype == np.int64, f
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)


def test_bijection_over_1000_steps_through_head_mapping():
    rng = np.random.default_rng(7)
    k, universe = 8, 40
    m = HeadMapping(max_requests=3, n_layers=2, n_kv_heads=2, slots=k)
    rows_a = m.allocate("a")
    rows_b = m.allocate("b")
    rows = np.r_[np.arange(rows_a.start, rows_a.stop), np.arange(rows_b.start, rows_b.stop)]
    # Temporal locality: each row's importance drifts slowly, so predictions overlap from step to step.
    score = rng.random((rows.size, universe))
    total_fetch = total_missing = 0
    for step in range(1000):
        score += rng.normal(0, 0.05, score.shape)
        pred = np.argsort(-score, axis=1, kind="stable")[:, :k]
        pred[rng.random(rows.size) < 0.05, k // 2 :] = -1  # some rows predict fewer blocks
        cap = rng.integers(0, 4, size=rows.size)
        p = plan_step(m.table[rows], m.last_sel[rows], pred, cap, step=step, max_cap=3)
        m.apply(p, rows)
        m.check()
        assert (p.n_fetch <= cap).all()
        total_fetch += int(p.n_fetch.sum())
        total_missing += int(p.n_missing.sum())
        if step == 499:  # swap a request mid-run: its rows start empty again
            m.release("b")
            rows_c = m.allocate("c")
            assert rows_c == rows_b
    assert 0 < total_fetch <= total_missing  # blocks did move, never more than the drift


# ---------------------------------------------------------------- the torch path never synchronises


@pytest.fixture
def no_host_sync(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("host synchronisation on the policy path")

    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, boom)


def test_plan_step_torch_path_never_syncs(no_host_sync):
    rng = np.random.default_rng(3)
    resident, last_sel, pred = (torch.as_tensor(a) for a in random_state(rng, 5, 8, 8, 12, lsmax=3))
    cap = torch.tensor([0, 1, 2, 3, 8])
    p = plan_step(resident, last_sel, pred, cap, step=4, max_cap=3)
    p = plan_step(p.resident, p.last_sel, pred, 2, step=5, max_cap=3)
    initial_plan(pred)
    with pytest.raises(AssertionError, match="synchronisation"):
        bool(p.n_fetch[0])  # the guard itself works


def test_mapping_rejects_a_plan_from_a_stale_table():
    m = HeadMapping(max_requests=1, n_layers=1, n_kv_heads=1, slots=2)
    rows = m.allocate(0)
    p = plan_step(arr([[5, -1]]), arr([[0, -1]]), arr([[6, 7]]), cap=1, step=1, max_cap=1)
    with pytest.raises(ValueError, match="different table"):
        m.apply(p, rows)


# ---------------------------------------------------------------- a victim cache: S > K slots, K attended


def test_attend_slots_takes_the_most_recently_selected_in_slot_order():
    from oasis_core.selection import attend_slots, attended_blocks

    resident = arr([[5, -1, 7, 9, 2, 4], [1, 2, -1, -1, -1, -1]])
    last_sel = arr([[0, -1, -3, 0, -2, -2], [0, -5, -1, -1, -1, -1]])
    # row 0: slots 0 and 3 were just selected; then ls -2 ties between slots 4 and 5: the higher slot wins
    assert attend_slots(resident, last_sel, 3).tolist() == [[0, 3, 5], [0, 1, -1]]
    # k == S: every resident slot
    assert attend_slots(resident, last_sel, 6).tolist() == [[0, 2, 3, 4, 5, -1], [0, 1, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="k must be"):
        attend_slots(resident, last_sel, 7)
    # the blocks those slots hold
    assert attended_blocks(resident, last_sel, 3).tolist() == [[5, 9, 4], [1, 2, -1]]


@pytest.mark.parametrize("seed", range(5))
def test_attend_slots_after_a_plan_holds_the_kept_and_admitted_blocks(seed):
    """Against a loop: after plan_step on S = 3K slots the attended set is the step's kept + admitted blocks, filled
    with the most recently selected others, and numpy == torch."""
    from oasis_core.selection import attend_slots

    rng = np.random.default_rng(seed)
    R, K, S, NB = 6, 8, 24, 60
    plan = initial_plan(arr([rng.permutation(NB)[:K] for _ in range(R)]), step=0, slots=S)
    res, ls = plan.resident, plan.last_sel
    for step in range(1, 12):
        pred = arr([rng.permutation(NB)[:K] for _ in range(R)])
        cap = int(rng.integers(0, K + 1))
        p = plan_step(res, ls, pred, cap, step, K)
        res, ls = p.resident, p.last_sel
        got = attend_slots(res, ls, K)
        assert np.array_equal(got, attend_slots(torch.tensor(res), torch.tensor(ls), K).numpy())
        for r in range(R):
            held = [s for s in range(S) if res[r, s] >= 0]
            want = sorted(held, key=lambda s: (ls[r, s], s), reverse=True)[:K]
            assert got[r][got[r] >= 0].tolist() == sorted(want)
            sel_now = {s for s in held if ls[r, s] == step}
            assert sel_now <= set(want)  # kept and admitted blocks are always attended
            assert {int(res[r, s]) for s in sel_now} == set(pred[r].tolist()) & set(res[r].tolist())
