"""Every fit the repository's recordings give (each committed recording set, and the synthetic set the validation
tests build) predicts no op faster than the roofline floor over a grid of shapes, on the recordings' hardware and
another, and a sparse attention time above zero."""

import glob
import itertools
import json
import os

import pytest
from replay_fakes import synthetic_recording

from oasis_core.recording import KIND, find_recordings, load_recording
from oasis_core.specs import get_hardware, get_model
from oasis_sim import validate as V
from oasis_sim.fitted import FittedPredictor, fit, nnls_relative
from oasis_sim.predictor import OPS, RooflinePredictor
from oasis_sim.replay import replay

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _is_recording(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("meta"), dict) and obj["meta"].get("kind") == KIND


def _recording_sets() -> dict:
    """Every folder of recordings: traces/recordings*/ (recordings only) and the recordings among the results of
    experiments/*/results/ (which hold other JSON too)."""
    sets = {d: find_recordings(d) for d in glob.glob(os.path.join(REPO, "traces", "recordings*"))}
    for d in glob.glob(os.path.join(REPO, "experiments", "*", "results")):
        sets[d] = [f for f in find_recordings(d) if _is_recording(f)]
    return {os.path.relpath(d, REPO): files for d, files in sorted(sets.items()) if files}


RECORDING_SETS = _recording_sets()

TOKENS = (1, 8, 64, 512, 4096, 16384, 65536)
GRID = {
    "gemm_layer": [{"tokens": t} for t in TOKENS],
    "norm_rope": [{"tokens": t} for t in TOKENS],
    "lm_head": [{"tokens": t} for t in TOKENS],
    "attn_decode": [{"kv_bytes": b} for b in (1e3, 1e6, 1e8, 1e9, 1e10)],
    "attn_prefill": [{"tokens": t, "past_tokens": p} for t, p in itertools.product((64, 4096, 16384), (0, 16384))],
    "score": [{"summary_bytes": b} for b in (1e3, 1e6, 1e8)],
    "topk": [{"elements": e} for e in (1e2, 1e5, 1e7)],
    "select": [{"rows": r} for r in (1, 1e3, 1e5)],
    "spec_repair": [{}],
    "spec_commit": [{"k": k} for k in (1, 2, 4)],
    "spec_beside": [{}],
    "sparse_overhead": [{"requests": n} for n in (1, 16, 256)],
    "side_contention": [{"hbm_bytes": b} for b in (0.0, 1e6, 1e9)],
    "step_overhead": [{}],
    "step_floor": [{"requests": n} for n in (1, 16)],
    "draft_step": [{"tokens": t} for t in TOKENS],
    "all_reduce": [{"bytes": b, "ranks": r} for b in (1e3, 1e6, 1e9) for r in (1, 2, 8)],
}


def _synthetic():
    return [
        synthetic_recording(mode=m, context=c, concurrency=n)
        for m in ("dense", "lookahead")
        for c in (4096, 16384)
        for n in (4, 16)
    ]


@pytest.mark.parametrize("source", ["synthetic", *RECORDING_SETS])
def test_fits_respect_the_roofline_floor(source):
    recs = _synthetic() if source == "synthetic" else [load_recording(f) for f in RECORDING_SETS[source]]
    model = fit([V.sample_of(r, replay(r)) for r in recs])
    assert model.fits, source
    assert set(GRID) == set(OPS)
    model_spec = get_model(recs[0].config["model"])
    for fam, fits in model.fits.items():
        for hw in sorted({recs[0].config["hardware"], "h100-sxm"}):
            base = RooflinePredictor(model_spec, get_hardware(hw))
            floor = RooflinePredictor.floor(model_spec, base.hw)
            p = FittedPredictor(base, fits)
            for op, shapes in GRID.items():
                for shape in shapes:
                    assert p.time(op, shape) >= floor.time(op, shape), (source, fam, hw, op, shape, fits.get(op))
            if fam == "sparse":
                assert p.time("attn_decode", {"kv_bytes": 1e6}) > 0, (source, hw, fits.get("attn_decode"))
    sparse = [r for r in recs if r.config["mode"] not in ("dense", "quest")]
    if sparse:  # the predictor a sparse recording is replayed with
        assert model.predictor_for(sparse[0]).time("attn_decode", {"kv_bytes": 1e6}) > 0


def test_nnls_with_a_floor_fits_the_excess():
    # y = floor + 2·x: the excess over the floor is recovered; a floor above every target leaves c = 0
    x, floor = [[1.0, 1.0], [3.0, 1.0], [5.0, 1.0]], [4.0, 4.0, 4.0]
    assert nnls_relative(x, [6.0, 10.0, 14.0], floor) == pytest.approx([2.0, 0.0])
    assert nnls_relative(x, [3.0, 3.5, 2.0], floor) == pytest.approx([0.0, 0.0])
