"""The per-layer pipeline: an exact hand-made timeline, and closed form == per-layer SimPy events."""

import random

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from oasis_sim.pipeline import LayerPipeline, LayerWork, at


def _events(works, n_layers):
    env = simpy.Environment()
    pipe = LayerPipeline(n_layers)
    out = []
    res = [simpy.Resource(env, 1) for _ in range(3)]

    def drive():
        for w in works:
            yield env.process(pipe.step_events(env, w, *res, out))

    env.process(drive())
    env.run()
    return out


def _closed(works, n_layers):
    pipe = LayerPipeline(n_layers)
    t, out = 0.0, []
    for w in works:
        r = pipe.step_closed(t, w, record=True)
        out.append(r)
        t = r.end
    return out


def test_three_layers_one_late_transfer_exact_stall():
    # Step 0: layers compute 0-1, 1-2, 2-3; transfers 1-1.5 (L0), 2-6 (L1, late), 6-6.5 (L2, queued behind L1).
    # Step 1: L0 3-4; L1 waits for its transfer until 6 (stall 2), 6-7; L2's transfer (6.5) is ready: 7-8.
    w0 = LayerWork(3, 0.0, 1.0, 0.0, True, 0.0, 0.0, [0.5, 4.0, 0.5])
    w1 = LayerWork(3, 0.0, 1.0, 0.0, True, 0.0, 0.0, 0.0)
    for steps in (_closed([w0, w1], 3), _events([w0, w1], 3)):
        s0, s1 = steps
        assert s0.compute == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)]
        assert sorted(s0.xfer) == [(1.0, 1.5), (2.0, 6.0), (6.0, 6.5)]
        assert (s0.end, s0.stall_s) == (3.0, 0.0)
        assert s1.compute == [(3.0, 4.0), (6.0, 7.0), (7.0, 8.0)]
        assert (s1.end, s1.stall_s) == (8.0, 2.0)


def test_side_stream_serialises_prediction_and_selection():
    # pred 0.75 + select 0.25 per layer on one side stream: layer 1's starts when layer 0's is done.
    w = LayerWork(2, 0.5, 0.5, 0.25, True, 0.75, 0.25, 0.5)
    for (s,) in (_closed([w], 2), _events([w], 2)):
        assert sorted(s.side) == [(1.0, 2.0), (2.0, 3.0)]
        assert sorted(s.xfer) == [(2.0, 2.5), (3.0, 3.5)]
        assert s.end == 1.75


def test_no_background_means_no_waiting():
    w = LayerWork(4, 0.1, [0.1, 0.2, 0.3, 0.4], 0.05)
    (s,) = _closed([w], 4)
    assert s.stall_s == 0.0 and s.end == 0.1 + 0.1 + 0.2 + 0.3 + 0.4 + 0.05


_dur = st.floats(0.0, 3.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_closed_form_equals_per_layer_events_bit_for_bit(n_layers, n_steps, seed):
    rnd = random.Random(seed)
    works = []
    for _ in range(n_steps):
        bg = rnd.random() < 0.8
        works.append(
            LayerWork(
                n_layers,
                rnd.random() * 0.1,
                [rnd.random() for _ in range(n_layers)],
                rnd.random() * 0.1,
                bg,
                [rnd.random() * 0.5 for _ in range(n_layers)],
                rnd.random() * 0.1,
                [rnd.choice([0.0, rnd.random() * 3]) for _ in range(n_layers)],
            )
        )
    for a, b in zip(_closed(works, n_layers), _events(works, n_layers)):
        assert (a.start, a.end, a.stall_s, a.compute) == (b.start, b.end, b.stall_s, b.compute)
        assert sorted(a.side) == sorted(b.side) and sorted(a.xfer) == sorted(b.xfer)


def test_at_fires_at_the_exact_absolute_time():
    env = simpy.Environment(initial_time=0.1)
    seen = []
    t = 0.1 + 0.2  # 0.30000000000000004: now + (t - now) would not round-trip for every t

    def p():
        yield at(env, t)
        seen.append(env.now)

    env.process(p())
    env.run()
    assert seen == [t]


def _closed_fast(works, n_layers):
    """Closed form without records: the engine's path, which fast-forwards steps that cannot stall."""
    pipe = LayerPipeline(n_layers)
    t, out = 0.0, []
    for w in works:
        r = pipe.step_closed(t, w)
        out.append(r)
        t = r.end
    return out, pipe


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_fast_forward_equals_per_layer_events_bit_for_bit(n_layers, n_steps, seed):
    # Scalar steps (the engine's shape), mostly in the no-stall regime, mixed with per-layer steps that stall.
    rnd = random.Random(seed)
    works = []
    for _ in range(n_steps):
        c = rnd.random() * 0.2 + 1e-3
        if rnd.random() < 0.7:
            works.append(
                LayerWork(
                    n_layers,
                    rnd.random() * 0.3,
                    c,
                    rnd.random() * 0.1,
                    rnd.random() < 0.8,
                    rnd.random() * c * 0.5,
                    rnd.random() * c * 0.2,
                    rnd.choice([0.0, rnd.random() * c * 0.3, rnd.random() * 2 * c]),
                )
            )
        else:
            works.append(
                LayerWork(
                    n_layers,
                    0.0,
                    [rnd.random() * 0.1 for _ in range(n_layers)],
                    0.0,
                    True,
                    0.01,
                    0.0,
                    [rnd.random() for _ in range(n_layers)],
                )
            )
    fast, pipe = _closed_fast(works, n_layers)
    slow = _closed(works, n_layers)
    ev = _events(works, n_layers)
    for a, b, e in zip(fast, slow, ev):
        assert (a.start, a.end, a.stall_s) == (b.start, b.end, b.stall_s) == (e.start, e.end, e.stall_s)
    ref = LayerPipeline(n_layers)
    t = 0.0
    for w in works:
        t = ref.step_closed(t, w, record=True).end
    assert (pipe.ready, pipe.side_free, pipe.link_free) == (ref.ready, ref.side_free, ref.link_free)


def test_fast_forward_is_taken_in_steady_state():
    pipe = LayerPipeline(36)
    w = LayerWork(36, 1e-4, 2e-4, 3e-4, True, 1e-5, 2e-5, 5e-5)
    t = 0.0
    for _ in range(3):
        t = pipe.step_closed(t, w).end
        assert pipe._lazy is not None  # no per-layer list was built
    assert len(pipe.ready) == 36 and pipe._lazy is None
