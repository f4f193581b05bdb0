"""Fuzz of the hand-written command lines (``python -m oasis_exec quality selection|endtoend|tasks`` and
``python -m oasis_exec.tools.draft_train corpus|train``): random option vectors (fixed seed; valid, invalid, extreme and
unknown values, bad paths) never give a traceback. A vector either stops at the first model load (patched to raise
``Reached``: its options passed every front-door check) or ends with exit 0 / 2 and at most one line on stderr."""

import random

import pytest

pytest.importorskip("torch")

from oasis_exec import __main__ as exec_main  # noqa: E402
from oasis_exec.model.decoder import Decoder  # noqa: E402
from oasis_exec.tools import draft_train  # noqa: E402

SEED, N = 20261201, 150


class Reached(Exception):
    """The run got past its checks to the model load."""


def _reach(*a, **k):
    raise Reached


NUM = ["1", "0", "-3", "16", "2048", "1e9", "nan", "inf", "0.5", "1.5", "abc", ""]
FRAC = ["0.125", "0.25", "1.0", "0", "-0.1", "1.5", "nan", "x"]
PATHS = ["/nonexistent/m.gguf", "/tmp", "README.md", "/proc/nope/out.json", "/x" * 2000]  # issue 35: a 4,000-char path
COMMON = {"--device": ["cpu", "cuda", "tpu", "cuda:0"], "--model-path": PATHS, "--out": ["/tmp/q.json", "/tmp"] + PATHS}
COMMANDS = {
    ("quality", "selection"): {
        **COMMON,
        "--n-tokens": NUM,
        "--k-frac": FRAC,
        "--block-size": ["16", "15", "0", "-16"],
        "--positions": NUM,
        "--n-layers": NUM,
        "--texts": ["GPL-3", "nope"],
        "--drafts": ["eagle3", "random", "bogus"],
        "--dtype": ["float32", "float16"],
        "--refit": ["/nonexistent.json"],
        "--policies": ["drift", "per-layer:0.5", "nope", "budget:x", "fixed:0.05"],
        "--policy-draft": ["eagle3", "random", "bogus"],
        "--policy-link-gb-s": NUM,
        "--threads": NUM,
        "--bogus": [""],
    },
    ("quality", "endtoend"): {
        **COMMON,
        "--lengths": NUM,
        "--k-fracs": FRAC,
        "--fetch-ratios": FRAC,
        "--top-k": NUM,
        "--ppl-tokens": NUM,
        "--greedy-tokens": NUM,
        "--passkey-depths": FRAC,
        "--block-size": ["16", "12"],
        "--time-budget-s": NUM,
        "--modes": ["dense", "lookahead", "sparse"],
        "--threads": NUM,
        "--fetch-policies": ["drift", "per-layer:0.5", "recall:2", "nope", "budget:x", "fixed:0.05", "DRIFT"],
        "--shift-lengths": NUM,
        "--shift-tokens": NUM,
        "--token-texts": ["/nonexistent.npz:text", "README.md", "experiments/long_context_draft/data/gemma_32k.npz:x"],
        "--token-basis": ["/nonexistent.npz"],
        "--draft-gates": FRAC,
    },
    ("quality", "tasks"): {
        **COMMON,
        "--lengths": NUM,
        "--trials": NUM,
        "--answer-tokens": NUM,
        "--depths": FRAC,
        "--k-fracs": FRAC,
        "--fetch-ratios": FRAC,
        "--top-k": NUM,
        "--min-dense": FRAC,
        "--max-lanes": NUM,
        "--tasks-file": ["/nonexistent.json", "README.md"],
        "--time-budget-s": NUM,
        "--modes": ["dense", "lookahead", "sparse"],
        "--block-scores": ["tokens", "minmax_sum+sink", "nope"],
        "--token-basis": ["/nonexistent.npz", "experiments/block_scorers/calib/gemma3_270m_basis.npz"],
        "--draft-gates": FRAC,
    },
}
TRAIN = {
    "corpus": {"--model-path": PATHS, "--out": ["/tmp/c.npz", "/tmp"] + PATHS, "--n-train": NUM, "--prompt-len": NUM},
    "train": {
        "--model-path": PATHS,
        "--corpus": ["/nonexistent.npz", "README.md"],
        "--out": ["/tmp/head", "README.md"],
        "--device": ["cpu", "cuda", "x"],
        "--steps": NUM,
        "--lr": NUM,
        "--dtype": ["bfloat16", "int8"],
    },
}


def _vectors(space, rng):
    for _ in range(N):
        opts = rng.sample(sorted(space), rng.randint(0, min(5, len(space))))
        argv = []
        for o in opts:
            v = rng.choice(space[o])
            argv += [o] if v == "" and o == "--bogus" else [o, v]
        yield argv


def _one(call, argv, capsys):
    try:
        rc = call(argv)
    except Reached:
        return "reached"
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert rc in (0, 2), (argv, rc, err)
    assert len([x for x in err.splitlines() if x.strip()]) <= 1, (argv, err)
    assert len(err) < 2500, (argv[:3], len(err))  # issue 35: an error line is bounded whatever the value
    return rc


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_quality_commands_never_trace_back(cmd, monkeypatch, capsys):
    monkeypatch.setattr(Decoder, "from_path", staticmethod(_reach))
    rng = random.Random(SEED)
    got = [_one(exec_main.main, [*cmd, *argv], capsys) for argv in _vectors(COMMANDS[cmd], rng)]
    assert "reached" in got and 2 in got  # both outcomes occur: the fuzz is not rejecting everything


@pytest.mark.parametrize("sub", sorted(TRAIN))
def test_draft_train_never_traces_back(sub, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(draft_train, "cmd_corpus", _reach)
    monkeypatch.setattr(draft_train, "cmd_train", _reach)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    import numpy as np

    corpus = tmp_path / "c.npz"  # a corpus train accepts (its arrays are checked before the model loads) ...
    np.savez(corpus, train=np.zeros((2, 8), np.int32), held=np.zeros((1, 8), np.int32))
    broken = tmp_path / "broken.npz"  # ... and one it refuses (issue 35: a corrupt corpus is one line, exit 2)
    broken.write_bytes(b"x")
    space = {**TRAIN[sub], "--model-path": PATHS + [str(model)] * 4}
    if sub == "train":
        space["--corpus"] = space["--corpus"] + [str(corpus)] * 3 + [str(broken)]
    rng = random.Random(SEED)
    got = []
    for argv in _vectors(space, rng):
        req = ["--model-path", str(model), "--out", str(tmp_path / "o")] + (
            ["--corpus", str(corpus)] if sub == "train" else []
        )
        got.append(_one(draft_train.main, [sub, *req, *argv], capsys))
    assert "reached" in got and 2 in got
