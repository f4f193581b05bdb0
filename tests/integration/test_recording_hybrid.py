"""Recordings of a hybrid model (issue 36): the executor's bench and serve recordings carry the model's layer kinds
(``config.layer_windows``), the file round-trips them, and the simulator's replay reads them: it runs the recording
on the preset whose kinds they are and refuses one whose kinds differ. Runs the executor for real on the tiny
Gemma-shaped model (registered as a simulator preset for the replay)."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest
import torch
from gemma_cases import TINY_GEMMA, WINDOW, cfg, prompts, tiny_decoder

from oasis_core import specs
from oasis_core.recording import load_recording, save_recording
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.runner.runner import Runner
from oasis_exec.server.record import ServeLog
from oasis_exec.server.recording import write_serve_recording
from oasis_exec.tools.bench import run_bench
from oasis_exec.tools.recorder import write_bench_recording
from oasis_sim.config import ConfigError
from oasis_sim.replay import replay, sim_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KINDS = [WINDOW, None, WINDOW, None]


@pytest.fixture
def presets(monkeypatch):
    """The tiny Gemma as a simulator preset, and a twin of it with other kinds (same shape, every layer full)."""
    monkeypatch.setitem(specs.MODELS, "tiny-gemma3", TINY_GEMMA)
    monkeypatch.setitem(
        specs.MODELS, "tiny-gemma3-full", replace(TINY_GEMMA, name="tiny-gemma3-full", layer_windows=())
    )


def test_bench_recording_carries_the_kinds_to_the_replay(tmp_path, presets):
    c = cfg("lookahead", selection="synthetic", top_k=4, host_kv_gb=0.01, max_lanes=2)
    bench = run_bench(c, 128, 2, 3, 1, decoder=tiny_decoder())
    assert bench["layer_windows"] == KINDS
    path = str(tmp_path / "bench.json")
    write_bench_recording(path, bench, c, hardware="h200", model="tiny-gemma3")
    rec = load_recording(path)
    assert rec.config["layer_windows"] == KINDS
    assert sim_config(rec).model_spec.layer_windows == tuple(KINDS)
    res = replay(rec)
    assert len(res.window) == 3 and res.predicted["tpot_ms_p50"] > 0
    wrong = load_recording(path)
    wrong.config["model"] = "tiny-gemma3-full"  # the same shape, other kinds: refused, naming the field
    with pytest.raises(
        ConfigError, match=r"layer_windows: the recorded layer kinds differ from model tiny-gemma3-full"
    ):
        sim_config(wrong)


def test_a_model_without_windows_records_no_kinds():
    c = cfg("lookahead", selection="synthetic", top_k=4, host_kv_gb=0.01, max_lanes=2, model="tiny")
    bench = run_bench(c, 128, 2, 2, 1)
    assert bench["layer_windows"] is None
    from oasis_exec.tools.recorder import recording_from_bench

    assert "layer_windows" not in recording_from_bench(bench, c, hardware="h200").config


def test_serve_recording_carries_the_kinds_to_the_replay(tmp_path, presets):
    c = cfg("dense", max_lanes=2)
    eng = Engine(c, Runner(c, decoder=tiny_decoder()))
    eng.generate(prompts(lens=(60,)), SamplingParams(max_tokens=6))
    log = ServeLog(str(tmp_path / "serve.json"), types.SimpleNamespace(engine=eng), hardware="h200")
    log.requests.append(
        {
            "id": 0,
            "arrival_s": 0.0,
            "prompt_tokens": 60,
            "output_tokens": 6,
            "finish_reason": "length",
            "ttft_ms": 5.0,
            "tpot_ms": 2.0,
            "finish_s": 0.015,
        }
    )
    log.step_ms = [2.0] * 6
    serve = log.serve_record()
    assert serve["layer_windows"] == KINDS
    rec = write_serve_recording(log.path, serve, c, hardware="h200", model="tiny-gemma3")
    back = load_recording(log.path)
    assert back.config["layer_windows"] == KINDS == rec.config["layer_windows"]
    assert sim_config(back).model_spec.layer_windows == tuple(KINDS)
    assert replay(back).predicted["tpot_ms_p50"] > 0
    back.config["layer_windows"] = [None] * 4  # edited to other kinds: refused
    save_recording(back, str(tmp_path / "edited.json"))
    with pytest.raises(ConfigError, match=r"layer_windows: the recorded layer kinds differ"):
        sim_config(load_recording(str(tmp_path / "edited.json")))
    assert torch.is_tensor(eng.runner.model.ring.k[0])  # it really ran the rings
