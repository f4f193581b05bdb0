"""bench --profile on the CPU: measured per-layer stage timestamps (layer_events) into the recording and its Chrome
trace. (The CUDA-event path of the same export is not exercised here.)"""

import json

import pytest

torch = pytest.importorskip("torch")

from oasis_core.recording import load_recording  # noqa: E402
from oasis_exec.config import ExecConfig  # noqa: E402
from oasis_exec.tools.bench import LAYER_EVENT_STEPS, layer_event_steps, run_bench  # noqa: E402
from oasis_exec.tools.recorder import write_bench_recording  # noqa: E402
from oasis_sim.replay import replay  # noqa: E402
from oasis_sim.timeline import exec_timeline  # noqa: E402


def _cfg(mode="lookahead", profile=True):
    return ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        selection="synthetic",
        top_k=4,
        max_context=256,
        host_kv_gb=0.01,
        kv_budget_gb=0.05,
        max_lanes=2,
        profile=profile,
        decode_chain=1,  # one decode step a scheduler step: the step sequence below
    )


def _monotone(events):
    """Events of one stream, in issue order: each starts no earlier than the previous one ended."""
    for (a0, a1), (b0, b1) in zip(events, events[1:]):
        assert a0 <= a1 <= b0 <= b1, (a0, a1, b0, b1)


def test_layer_event_steps_are_bounded_and_spread():
    assert layer_event_steps(3) == [0, 1, 2]
    assert layer_event_steps(32) == [0, 10, 21, 31]
    assert len(layer_event_steps(1000)) == LAYER_EVENT_STEPS


def test_cpu_profile_exports_layer_events(tmp_path):
    bench = run_bench(_cfg(), 128, 2, 6, 1)
    ev = bench["layer_events"]
    L = 2  # the tiny model
    steps = layer_event_steps(6)
    assert all(isinstance(e, list) and len(e) == 5 for e in ev)
    assert sorted({e[0] for e in ev}) == steps and len(steps) <= LAYER_EVENT_STEPS
    for s in steps:
        mine = [e for e in ev if e[0] == s]
        assert {(e[1], e[2]) for e in mine} == {
            (l, k) for l in range(L) for k in ("layers", "pred", "select", "transfer")
        }
        by = {(e[1], e[2]): (e[3], e[4]) for e in mine}
        _monotone([by[l, "layers"] for l in range(L)])  # main stream
        _monotone([by[l, k] for l in range(L) for k in ("pred", "select")])  # prediction + selection stream
        _monotone([by[l, "transfer"] for l in range(L)])  # copy stream
        for l in range(L):  # on the CPU the prefetch of layer l runs inline, inside layer l
            assert by[l, "layers"][0] <= by[l, "pred"][0] and by[l, "transfer"][1] <= by[l, "layers"][1]
    ends = {s: max(e[4] for e in ev if e[0] == s) for s in steps}
    starts = {s: min(e[3] for e in ev if e[0] == s) for s in steps}
    assert all(ends[a] <= starts[b] for a, b in zip(steps, steps[1:]))  # ms since the first timed step began

    path = str(tmp_path / "p.json")
    write_bench_recording(path, bench, _cfg(), hardware="h200")
    rec = load_recording(path)
    assert rec.results["layer_events"] == ev
    xs = [e for e in exec_timeline(rec)["traceEvents"] if e["ph"] == "X" and not e["name"].startswith("step")]
    assert len(xs) == len(ev)
    assert {(e["tid"], e["name"]) for e in xs} >= {
        (1, "layers L0"),
        (2, "pred L1"),
        (2, "select L0"),
        (3, "transfer L1"),
    }
    first = [e for e in xs if e["name"] == "layers L1" and e["args"]["step"] == steps[-1]][0]
    want = [e for e in ev if e[:3] == [steps[-1], 1, "layers"]][0]
    assert first["ts"] == pytest.approx(want[3] * 1e3, abs=1e-3)
    files = replay(rec).files()  # oasis_sim replay's exec_timeline.json beside the predicted timeline.json
    measured = json.loads(files["exec_timeline.json"])
    assert sum(1 for e in measured["traceEvents"] if e.get("name") == "transfer L0") == len(steps)
    assert "timeline.json" in files


def test_dense_profile_has_main_stream_only_and_no_profile_has_none():
    ev = run_bench(_cfg("dense"), 64, 1, 2, 1)["layer_events"]
    assert {e[2] for e in ev} == {"layers"} and sorted({e[0] for e in ev}) == [0, 1]
    assert "layer_events" not in run_bench(_cfg(profile=False), 64, 1, 2, 1)


def test_bench_times_steady_steps_only(monkeypatch):
    """No request finishes inside a timed step: the bench gives each request one token more and runs the step in
    which they all finish untimed, after the timed ones."""
    from oasis_exec.engine.engine import Engine

    finishing, real_step = [], Engine.step

    def step(self):
        out = real_step(self)
        finishing.append(sum(o.finish_reason is not None for o in out))
        return out

    monkeypatch.setattr(Engine, "step", step)
    rec = run_bench(_cfg(profile=False), 64, 2, 3, 1)
    assert len(rec["step_ms"]) == 3
    # 1 warm-up + 3 timed steps (the loop), then the untimed one in which both requests finish
    assert finishing == [0, 0, 0, 0, 2]
