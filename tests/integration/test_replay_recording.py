"""The recording format (oasis_core.recording), the torch-free bench recorder and the executor timeline."""

import json
import subprocess
import sys

import numpy as np
import pytest
from replay_fakes import base_config, fake_results

from oasis_core.recording import (
    RecordingError,
    build_recording,
    label,
    load_recording,
    load_selection,
    save_recording,
    save_selection,
)
from oasis_core.trace import TraceError, dumps_trace, load_trace
from oasis_exec.tools.recorder import recording_from_bench, sample_steps, write_bench_recording
from oasis_sim.timeline import exec_timeline

BENCH = {
    "mode": "lookahead",
    "context": 16384,
    "concurrency": 24,
    "requested_concurrency": 32,
    "max_lanes": 24,
    "kv_budget_gb": 110.0,
    "host_kv_gb": 60.0,
    "steps": 32,
    "warmup": 5,
    "throughput_tok_s": 1234.5,
    "tpot_ms_p50": 19.4,
    "tpot_ms_p99": 21.0,
    "tpot_ms_mean": 19.5,
    "layer_ms": 0.45,
    "stage_ms_per_step": {
        "layers": 16.2,
        "pred": 2.1,
        "select": 0.8,
        "transfer": 3.3,
        "host_gather": 4.0,
        "stall": 0.25,
    },
    "bytes_moved_per_step": 1.5e8,
    "bytes_moved_total": 4.8e9,
    "transfer_gb_s": 45.0,
    "hidden_fraction": 0.92,
    "drift_blocks_per_step": 3.1,
    "peak_gpu_bytes": 10**11,
    "host_pool_bytes": 6e10,
    "peak_host_bytes": 7e10,
    "selection": "synthetic",
    "transfer": "host",
    "no_transfer": False,
    "fetch_ratio": 0.05,
    "top_k": 128,
    "model": "qwen3-8b",
    "dummy_weights": True,
    "synthetic_params": None,
    "prefill": "synthesized (random KV)",
    "build_s": 20.0,
    "device": "NVIDIA H200",
    "date": "2026-12-01T10:00:00+00:00",
    "commit": "abc1234",
}


def test_round_trip_is_byte_stable(tmp_path):
    rec = build_recording(base_config(), fake_results(steps=[{"step": 0, "duration_s": 0.02}]))
    p = tmp_path / "r.json"
    save_recording(rec, p)
    back = load_recording(p)
    assert back.trace == rec.trace
    assert dumps_trace(back.trace) == p.read_text()
    assert back.name == "r" and rec.name == "lookahead-8k-c8-fr0.05"
    # it is a trace in the core schema: the plain loader reads it
    t = load_trace(p)
    assert len(t.requests) == 8 and t.requests[0].prompt_tokens == 8192 and t.requests[0].output_tokens == 14


def test_label():
    assert label(base_config(mode="dense", context=32768, concurrency=64)) == "dense-32k-c64"
    assert label(base_config(fetch_ratio=0.1)) == "lookahead-8k-c8-fr0.1"


def _write(tmp_path, obj):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(obj))
    return p


def _doc(**change):
    rec = build_recording(base_config(), fake_results())
    obj = json.loads(dumps_trace(rec.trace))
    for path, value in change.items():
        node = obj
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        if value is _DEL:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return obj


_DEL = object()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"config__top_k": 0}, "bad.json: config.top_k: must be >= 1, got 0"),
        (
            {"config__mode": "fast"},
            'bad.json: config.mode: must be one of dense, quest, retrieval, proxy, lookahead, hisparse, got "fast"',
        ),
        ({"config__fetch_ratio": 1.5}, "bad.json: config.fetch_ratio: must be in (0, 1], got 1.5"),
        ({"config__concurrency": "8"}, 'bad.json: config.concurrency: must be an integer, got "8" (string)'),
        ({"config__seed": _DEL}, "bad.json: config.seed: missing required field"),
        (
            {"config__transfer_path": None},
            'bad.json: config.transfer_path: must be one of dma, uva for mode "lookahead", got null',
        ),
        ({"results__tpot_ms_p50": -1}, "bad.json: results.tpot_ms_p50: must be >= 0.0, got -1"),
        (
            {"results__tpot_ms_p99": 1.0},
            "bad.json: results.tpot_ms_p99: must be >= results.tpot_ms_p50 (20.0), got 1.0",
        ),
        ({"results__hidden_fraction": 1.2}, "bad.json: results.hidden_fraction: must be <= 1.0, got 1.2"),
        (
            {"results__stage_ms_per_step": {"pred": "x"}},
            'bad.json: results.stage_ms_per_step.pred: must be a number, got "x" (string)',
        ),
        ({"results__device": _DEL}, "bad.json: results.device: missing required field"),
        (
            {"results__layer_events": [[0, 1, "pred", 2.0, 1.0]]},
            "bad.json: results.layer_events[0][4]: must be >= start_ms (2.0), got 1.0",
        ),
        (
            {"results__steps": [{"step": 3, "duration_s": 0.1}, {"step": 3, "duration_s": 0.1}]},
            "bad.json: results.steps[1].step: must be > results.steps[0].step (3), got 3",
        ),
        (
            {"meta__kind": _DEL},
            'bad.json: meta.kind: must be "oasiskv-recording" (this is a plain trace, not a '
            'recording), got null (null)',
        ),
        (
            {"meta__recording_version": 2},
            "bad.json: meta.recording_version: must be 1 (the version this loader reads), got 2 (integer)",
        ),
        ({"results": _DEL}, "bad.json: results: missing required field"),
        (
            {"requests": [{"id": 0, "arrival_s": 0, "prompt_tokens": 8192, "output_tokens": 14}]},
            "bad.json: requests: must hold config.concurrency (8) requests for a closed-loop recording, got 1",
        ),
    ],
)
def test_errors_are_one_line_and_name_the_field(tmp_path, change, message):
    p = _write(tmp_path, _doc(**change))
    with pytest.raises(RecordingError) as e:
        load_recording(p)
    assert str(e.value) == str(p.parent / message)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, TraceError)


def test_trace_level_errors_pass_through(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{")
    with pytest.raises(RecordingError, match=r"x.json: invalid JSON at line 1"):
        load_recording(p)
    with pytest.raises(RecordingError, match=r"nope.json: cannot read"):
        load_recording(tmp_path / "nope.json")


def test_build_recording_errors_name_the_source():
    with pytest.raises(RecordingError, match=r"^<recording>: config.context: must be >= 1, got 0$"):
        build_recording(base_config(context=0), fake_results())
    with pytest.raises(RecordingError, match=r"^mine: results.steps\[0\].duration_s: missing required field$"):
        build_recording(base_config(), fake_results(steps=[{"step": 0}]), source="mine")


def test_selection_npz_round_trip_and_errors(tmp_path):
    rng = np.random.default_rng(1)
    sets = rng.integers(-1, 900, size=(5, 16, 128))
    p = tmp_path / "s.sel.npz"
    save_selection(p, sets, [0, 35])
    got, layers = load_selection(p, top_k=128)
    assert np.array_equal(got, sets) and layers.tolist() == [0, 35]
    with pytest.raises(RecordingError, match=r"s.sel.npz: sets: must have top_k = 64 columns, got 128"):
        load_selection(p, top_k=64)
    q = tmp_path / "bad.npz"
    np.savez(q, sets=np.zeros((1, 2, 3), dtype=np.int32), layers=np.zeros(1, dtype=np.int32))
    with pytest.raises(RecordingError, match=r"bad.npz: sets: must be an integer array \[steps >= 2"):
        load_selection(q)
    (tmp_path / "junk.npz").write_text("not numpy")
    with pytest.raises(RecordingError, match=r"junk.npz: "):
        load_selection(tmp_path / "junk.npz")


def test_recorder_maps_bench_record(tmp_path):
    b = dict(BENCH, steps=200, step_ms=[19.0 + 0.01 * i for i in range(200)])
    path = str(tmp_path / "rec" / "la.json")
    sets = np.arange(3 * 8 * 128).reshape(3, 8, 128) % 1000
    rec = write_bench_recording(
        path, b, {"block_size": 16, "seed": 3, "model": "qwen3-8b"}, selection_sets=sets, selection_layers=[0]
    )
    back = load_recording(path)
    c, r = back.config, back.results
    assert c["transfer_path"] == "dma" and c["exec_transfer"] == "host" and c["hardware"] == "h200"
    assert (c["concurrency"], c["requested_concurrency"], c["context"], c["seed"]) == (24, 32, 16384, 3)
    assert (c["warmup_steps"], c["steps"]) == (5, 200)
    assert r["bytes_per_step"] == {"pcie_h2d": 1.5e8} and r["link_bytes"] == {"pcie_h2d": 4_800_000_000}
    assert r["stall_ms_per_step"] == 0.25 and r["ttft_ms_p50"] is None
    assert len(r["steps"]) <= 64 and r["steps_sampled_of"] == 200
    assert r["steps"][0]["step"] == 0 and r["steps"][-1]["step"] == 199
    assert back.selection_path() == str(tmp_path / "rec" / "la.sel.npz")
    assert np.array_equal(load_selection(back.selection_path())[0], sets)
    assert rec.trace == back.trace


def test_recorder_keeps_the_prediction_top_k_the_bench_ran(tmp_path):
    """``topk_kernel`` goes from the bench record into the recording (null: the run made no top-K, synthetic sets
    without ``synthetic_topk``); a record without the key leaves it unknown, and a bad value is refused."""
    for i, (given, kept) in enumerate(((("fused",), "fused"), ((None,), None), ((), "absent"))):
        b = dict(BENCH, topk_kernel=given[0]) if given else dict(BENCH)
        back = load_recording(write_bench_recording(str(tmp_path / f"t{i}.json"), b, {"block_size": 16}).source)
        assert back.config.get("topk_kernel", "absent") == kept
    with pytest.raises(RecordingError, match="topk_kernel"):
        build_recording(dict(base_config(), topk_kernel="radix"), fake_results())


def test_sample_steps_keeps_the_slowest():
    ms = [10.0] * 500
    ms[137] = 99.0
    s = sample_steps(ms, 16)
    assert len(s) <= 16 and any(x["step"] == 137 for x in s)
    assert [x["step"] for x in s] == sorted(x["step"] for x in s)


def test_recorder_needs_hardware_for_unknown_device():
    with pytest.raises(ValueError, match=r"hardware: cannot tell the preset from device 'cpu'"):
        recording_from_bench(dict(BENCH, device="cpu"))
    rec = recording_from_bench(dict(BENCH, device="cpu", mode="dense", transfer=None), hardware="h200")
    assert rec.config["transfer_path"] is None and rec.results["stall_ms_per_step"] == 0.25


def test_exec_timeline_from_layer_events_and_mean():
    events = [[0, l, s, 0.4 * l + o, 0.4 * l + o + 0.1] for l in range(3) for s, o in (("layers", 0), ("pred", 0.1))]
    rec = recording_from_bench(dict(BENCH, layer_events=events, step_ms=[1.5, 1.6]))
    tl = exec_timeline(rec)
    xs = [e for e in tl["traceEvents"] if e["ph"] == "X"]
    assert {(e["tid"], e["name"]) for e in xs} >= {(1, "layers L0"), (2, "pred L2"), (4, "step 0"), (4, "step 1")}
    step1 = [e for e in xs if e["name"] == "step 1"][0]
    assert step1["ts"] == 1500.0 and step1["dur"] == 1600.0
    mean = exec_timeline(recording_from_bench(BENCH))
    names = {e["name"] for e in mean["traceEvents"] if e["ph"] == "X"}
    assert names == {"mean step", "layers", "pred", "select", "transfer", "host_gather", "stall"}
    assert all(e["args"]["mean"] for e in mean["traceEvents"] if e["ph"] == "X")


def test_recorder_and_format_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None; import oasis_exec.tools.recorder, oasis_core.recording, "
        "oasis_sim.replay, oasis_sim.validate, oasis_sim.fitted; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_real_cpu_bench_record_becomes_a_replayable_recording(tmp_path):
    pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.tools.bench import run_bench
    from oasis_sim.replay import replay

    cfg = ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        selection="synthetic",
        top_k=4,
        max_context=256,
        host_kv_gb=0.01,
        kv_budget_gb=0.05,
        max_lanes=2,
        decode_chain=1,  # a recording: one decode step a scheduler step
    )
    bench = run_bench(cfg, 128, 2, 3, 1)
    path = str(tmp_path / "cpu.json")
    rec = write_bench_recording(path, bench, cfg, hardware="h200")
    assert [s["step"] for s in rec.results["steps"]] == [0, 1, 2]
    assert rec.results["step_ms_mean"] == bench["step_ms_mean"]  # what the fitter reads as a step's time
    assert rec.config["top_k"] == 4 and rec.config["concurrency"] == 2
    assert rec.config["transfer_path"] == "uva"  # the default transfer auto runs the UVA gather
    res = replay(load_recording(path))
    assert len(res.window) == 3 and res.predicted["tpot_ms_p50"] > 0


def test_recorded_fetch_policy_reaches_the_replay(tmp_path):
    """A bench record's fetch_policy goes into its recording, and the replay runs that policy (an adaptive one with
    the exact per-step plans); a record without one replays the fixed cap of its ratio."""
    from oasis_sim.replay import sim_config

    for spec, sampling in (("drift", "exact"), ("fixed:0.1", None), (None, None)):
        b = dict(BENCH, fetch_policy=spec)
        rec = write_bench_recording(str(tmp_path / f"r{spec}.json"), b, {"block_size": 16, "model": "qwen3-8b"})
        back = load_recording(rec.source)
        assert back.config["fetch_policy"] == spec
        cfg = sim_config(back)
        assert cfg.fetch_policy == spec
        if sampling:
            assert cfg.policy_sampling == sampling


def test_the_copy_less_twin_replays_without_copies(tmp_path):
    """A bench record of the no-transfer twin replays as one (the simulator copies nothing), so the overlap ratio
    (TPOT / twin) can be predicted; before 2026-12-06 the replay ran the twin with its copies."""
    from oasis_sim.replay import replay, sim_config

    out = {}
    for nt in (False, True):
        rec = write_bench_recording(
            str(tmp_path / f"nt{nt}.json"), dict(BENCH, no_transfer=nt), {"block_size": 16, "model": "qwen3-8b"}
        )
        back = load_recording(rec.source)
        assert sim_config(back).no_transfer is nt
        out[nt] = replay(back).predicted
    assert out[True]["pcie_h2d_bytes_per_step"] == 0 < out[False]["pcie_h2d_bytes_per_step"]


def test_a_replay_runs_single_steps_as_recorded():
    """A recording's steps are single decode steps (``bench --record`` runs chains off, ``recording_from_bench``
    refuses a chained run), so its replay turns the simulator's default decode and speculative chains off."""
    import os

    from oasis_sim.config import SimConfig
    from oasis_sim.replay import sim_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rec = load_recording(os.path.join(root, "traces", "recordings", "lookahead-16k-c16-fr0.05.json"))
    assert SimConfig().decode_chain > 1 and SimConfig().spec_chain > 1  # the defaults chain
    c = sim_config(rec)
    assert c.decode_chain == 1 and c.spec_chain == 1
