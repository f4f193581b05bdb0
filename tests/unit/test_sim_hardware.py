"""Exact SimPy timelines of the hardware resources."""

import simpy

from oasis_sim.hardware import CopyPath, FairLink, MemoryPool, maxmin_rates


def _run_flows(bw, flows, latency=0.0, caps=None):
    env = simpy.Environment()
    log = []
    nic = FairLink(env, bw, latency, log=lambda t, tag, what, fid: log.append((t, tag, what)))

    def proc(tag, t0, n, cap):
        yield env.timeout(t0)
        yield nic.send(n, cap_Bps=cap, tag=tag)
        log.append((env.now, tag, "got"))

    for _i, (tag, t0, n) in enumerate(flows):
        env.process(proc(tag, t0, n, (caps or {}).get(tag, float("inf"))))
    env.run()
    return log, nic


def test_two_flows_share_a_nic_max_min_fair():
    # A: 100 B at t=0 alone at 10 B/s; B: 50 B joins at t=1 -> 5 B/s each; B ends at 11, A (40 B left) at 15.
    log, nic = _run_flows(10.0, [("A", 0, 100), ("B", 1, 50)])
    assert log == [
        (0, "A", "start"),
        (1, "B", "start"),
        (11.0, "B", "end"),
        (11.0, "B", "got"),
        (15.0, "A", "end"),
        (15.0, "A", "got"),
    ]
    assert nic.bytes_moved == 150.0


def test_capped_flow_leaves_its_share_to_the_other():
    # C capped at 2 B/s: D gets 8 B/s. D (80 B) ends at 10; C has 20 B done, 20 left alone at 2 B/s -> 20.
    log, _ = _run_flows(10.0, [("C", 0, 40), ("D", 0, 80)], caps={"C": 2.0})
    assert [e for e in log if e[2] == "got"] == [(10.0, "D", "got"), (20.0, "C", "got")]


def test_latency_delays_the_join():
    log, _ = _run_flows(10.0, [("A", 0, 10)], latency=0.5)
    assert log == [(0.5, "A", "start"), (1.5, "A", "end"), (1.5, "A", "got")]


def test_maxmin_rates_water_filling():
    assert maxmin_rates(12.0, [1.0, float("inf"), float("inf")]) == [1.0, 5.5, 5.5]
    assert maxmin_rates(12.0, [5.0, 6.0, 7.0]) == [4.0, 4.0, 4.0]
    assert maxmin_rates(10.0, [1.0, 2.0]) == [1.0, 2.0]


def test_fair_share_for_a_new_flow():
    env = simpy.Environment()
    nic = FairLink(env, 9.0)
    nic.send(100)
    nic.send(100)
    assert nic.fair_share_Bps() == 3.0


def test_copy_path_fifo_with_latency():
    env = simpy.Environment()
    path = CopyPath(env, 100.0, 0.5, "h2d")
    done = []

    def go(name, n):
        yield env.process(path.transfer(n))
        done.append((env.now, name))

    env.process(go("a", 100))
    env.process(go("b", 50))
    env.run()
    assert done == [(1.5, "a"), (2.5, "b")]
    assert path.bytes_moved == 150 and path.duration(0) == 0.0


def test_memory_pool_reserve_release_peak_and_series():
    env = simpy.Environment()
    pool = MemoryPool(env, 100, "hbm")
    assert pool.try_reserve(60) and not pool.try_reserve(50) and pool.try_reserve(40)
    pool.release(70)
    assert (pool.level, pool.peak, pool.free) == (30, 100, 70)
    assert pool.series[-1] == (0, 30)
