"""``python -m oasis_exec bench|generate`` on the CPU: clipped concurrency is announced and recorded, and a fuzz of
the argument space never ends in a traceback (exit 0, or one line on stderr and exit 2)."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys

import pytest

import oasis_exec.__main__ as cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--model", "tiny", "--device", "cpu", "--dtype", "float32", "--top-k", "4", "--selection", "synthetic"]
SMALL = ["--context", "64", "--steps", "2", "--warmup", "1"]


def _bench(argv, tmp_path):
    out = tmp_path / "r.jsonl"
    assert cli.main(["bench", *TINY, *SMALL, "--out", str(out), *argv]) == 0
    return json.loads(out.read_text().splitlines()[-1])


def test_concurrency_clipped_by_the_gpu_lanes_is_announced_and_recorded(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="oasis_exec.tools.bench"):
        rec = _bench(["--concurrency", "6"], tmp_path)  # no budget, no --max-lanes: 4 lanes
    assert (rec["requested_concurrency"], rec["concurrency"], rec["clipped_by"]) == (6, 4, "gpu_lanes")
    assert any("concurrency 6 clipped to 4" in r.getMessage() and "lanes" in r.getMessage() for r in caplog.records)


def test_concurrency_clipped_by_the_host_pool(tmp_path, caplog):
    # tiny: 8192 bytes a host block, 5 blocks a request (64 + 1 + 2 + 1 tokens): 7 blocks hold one
    with caplog.at_level(logging.WARNING, logger="oasis_exec.tools.bench"):
        rec = _bench(["--concurrency", "3", "--host-kv-gb", str(7 * 8192 / 1e9)], tmp_path)
    assert (rec["requested_concurrency"], rec["concurrency"], rec["clipped_by"]) == (3, 1, "host_pool")
    assert any("host pool" in r.getMessage() for r in caplog.records)


def test_unclipped_runs_say_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="oasis_exec.tools.bench"):
        rec = _bench(["--concurrency", "2"], tmp_path)
    assert (rec["requested_concurrency"], rec["concurrency"], rec["clipped_by"]) == (2, 2, None)
    assert not caplog.records


def test_the_announcement_is_one_line_on_stderr_of_the_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run(
        [sys.executable, "-m", "oasis_exec", "bench", *TINY, *SMALL, "--concurrency", "5"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == (
        "bench: concurrency 5 clipped to 4: the lanes the GPU KV store holds "
        "(--kv-budget-gb, --max-lanes; without either: 4)"
    )
    assert json.loads(p.stdout)["clipped_by"] == "gpu_lanes"
    bad = subprocess.run(
        [sys.executable, "-m", "oasis_exec", "bench", "--top-k", "1e9"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "python -m oasis_exec bench: error: argument --top-k: must be an integer, got '1e9'\n"


# -- the fuzz ------------------------------------------------------------------------------------------------------


def _values(tmp_path):
    """option -> values to draw from, valid and not; None: the option is a flag without a value."""
    folder = str(tmp_path)
    return {
        "--model": ["tiny", "qwen3-8b", "nope", ""],
        "--model-path": [str(tmp_path / "absent")],
        "--dummy": None,
        "--profile": None,
        "--no-cuda-graph": None,
        "--no-transfer": None,
        "--no-fused-ops": None,
        "--prefill-interleave": None,
        "--no-prefill-interleave": None,
        "--device": ["cpu", "cuda", "cuda:1", "gpu", "CPU"],
        "--dtype": ["float32", "bfloat16", "float16"],
        "--mode": ["dense", "quest", "retrieval", "proxy", "lookahead", "sparse"],
        "--selection": ["synthetic", "model", "replay", "magic"],
        "--replay-path": [str(tmp_path / "sets.npz")],
        "--replay-ids": ["wrap", "scale", "mod"],
        "--top-k": ["4", "128", "0", "-3", "x", "1e9", "2.5"],
        "--block-size": ["16", "8", "3", "0", "-16"],
        "--fetch-ratio": ["0.05", "1", "0", "1.5", "nan", "inf", "-0.1"],
        "--kv-budget-gb": ["0.01", "52", "0", "-1", "inf", "1e-12"],
        "--host-kv-gb": ["0.5", "0", "-2", "nan"],
        "--host-requests": ["2", "0", "-1"],
        "--max-lanes": ["2", "0", "9999999"],
        "--transfer": ["auto", "uva", "host", "dma"],
        "--host-kernel": ["auto", "torch", "native", "rust"],
        "--host-threads": ["8", "0"],
        "--uva-programs": ["32", "0"],
        "--uva-kernel": ["loads", "tma", "x"],
        "--stream-priority": ["auto", "high", "urgent"],
        "--copy-graph": ["on", "off", "auto", "true"],
        "--prefill-chunk": ["2048", "0"],
        "--draft-vocab": ["32000", "0"],
        "--seed": ["0", "7", "-1", "s"],
        "--synthetic": [
            '{"drift_rate": 0.1}',
            '{"preset": "smollm2"}',
            '{"preset": "nope"}',
            '{"nope": 1}',
            '{"drift_rate": 9}',
            "[1]",
            "{bad",
            "null",
        ],
        "--bogus": None,
        "--top": ["4"],  # unknown; a prefix of two options
        # bench
        "--context": ["64", "0", "-5", "abc", "16384"],
        "--concurrency": ["2", "0", "-1", "64"],
        "--steps": ["2", "0"],
        "--warmup": ["1", "0", "-1"],
        "--out": [str(tmp_path / "o" / "r.jsonl"), folder, "/proc/no/such/r.jsonl"],
        "--record": [str(tmp_path / "rec.json"), folder],
        "--record-hardware": ["h200", "h100-sxm", "abacus"],
        "--prompt-text": [
            str(tmp_path / "absent.txt"),
            "experiments/long_context_draft/data/gemma_32k.npz:text:licences",
            "experiments/long_context_draft/data/gemma_32k.npz:nokey",
            "experiments/long_context_draft/data/gemma_32k.npz:held",
        ],
        "--no-host-fill": None,
        # generate
        "--prompt-ids": ["1,2,3", "", "a,b", "-1", "1,,2"],
        "--max-tokens": ["4", "0", "-2"],
        "--max-context": ["64", "8", "0", "1000000"],
    }


def _vectors(tmp_path, n: int, seed: int = 20261201):
    rnd = random.Random(seed)
    space = _values(tmp_path)
    names = sorted(space)
    for _ in range(n):
        argv = [rnd.choice(["bench", "generate"])]
        for name in rnd.sample(names, rnd.randint(0, 7)):
            argv.append(name)
            vals = space[name]
            if vals is not None and rnd.random() > 0.05:  # now and then the value is missing
                argv.append(rnd.choice(vals))
        yield argv


def _outcome(argv, capsys):
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    got = capsys.readouterr()
    return rc, got.err, got.out


def test_fuzz_parsing_and_validation_never_raise(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(cli, "run_bench_command", lambda cfg, bc: ran.append(("bench", cfg, bc)) or 0)
    monkeypatch.setattr(cli, "run_generate_command", lambda cfg, ids, n: ran.append(("generate", cfg, ids)) or 0)
    codes = {0: 0, 2: 0}
    for argv in _vectors(tmp_path, 400):
        rc, err, _ = _outcome(argv, capsys)  # anything but SystemExit fails the test with its traceback
        assert rc in (0, 2), (argv, rc, err)
        codes[rc] += 1
        if rc == 2:
            assert err.count("\n") == 1 and ": error: " in err and "Traceback" not in err, (argv, err)
    assert codes[0] >= 20 and codes[2] >= 100, codes  # the space has both, in numbers
    assert {kind for kind, _, _ in ran} == {"bench", "generate"}
    for kind, cfg, extra in ran:  # what passed validation is a config the executor accepts
        assert cfg.top_k >= 1 and 0 < cfg.fetch_ratio <= 1 and cfg.block_size & (cfg.block_size - 1) == 0
        if kind == "bench":
            assert extra.context >= 1
            assert cfg.max_context == extra.engine_max_context(cfg.block_size, cfg.step_tokens_max - 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", *TINY, *SMALL, "--concurrency", "2", "--mode", "dense"],
        [
            "bench",
            *TINY,
            *SMALL,
            "--concurrency",
            "2",
            "--mode",
            "retrieval",
            "--no-host-fill",
            "--kv-budget-gb",
            "0.05",
        ],
        ["generate", *TINY, "--prompt-ids", "5,6,7", "--max-tokens", "3", "--max-context", "64", "--mode", "proxy"],
    ],
)
def test_valid_vectors_run_on_the_cpu(argv, capsys):
    rc, err, out = _outcome(argv, capsys)
    assert rc == 0, err
    rec = json.loads(out)
    if argv[0] == "bench":
        assert (rec["concurrency"], rec["steps"], rec["mode"]) == (2, 2, argv[argv.index("--mode") + 1])
    else:
        assert len(rec["output_ids"]) == 3


def test_prompt_text_token_ids_from_an_npz(capsys):
    """--prompt-text FILE.npz:KEY[:ROW]: the ids as stored (no tokenizer), and a bad key is one line before loading."""
    import numpy as np

    f = "experiments/long_context_draft/data/gemma_32k.npz"
    with np.load(f) as z:
        want, row = z["text:licences"].tolist(), z["held"][1].tolist()
    assert cli._prompt_tokens(f + ":text:licences", None) == want and len(want) >= 32768
    assert cli._prompt_tokens(f + ":held:1", None) == row
    rc = cli.main(["bench", "--model-path", f, "--prompt-text", f + ":nokey", "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--prompt-text" in err and "nokey" in err and "Traceback" not in err, err
    assert "--token-texts" not in err, err  # the error names the option given


def test_prompt_token_ids_on_dummy_weights(tmp_path, capsys):
    """--prompt-text FILE.npz:KEY:ROW needs no --model-path (ids, no tokenizer): dummy weights prefill them for
    real; ids past the model's vocabulary are one line, not an IndexError."""
    import numpy as np

    f = tmp_path / "ids.npz"
    np.savez(f, ok=np.arange(1, 200) % 250, big=np.arange(300))
    out = tmp_path / "r.jsonl"
    base = ["bench", "--model", "tiny", "--device", "cpu", "--dtype", "float32", "--context", "64"]
    base += ["--concurrency", "2", "--steps", "1", "--warmup", "1", "--out", str(out)]
    assert cli.main([*base, "--prompt-text", f"{f}:ok"]) == 0
    rec = json.loads(out.read_text().splitlines()[-1])
    assert rec["prefill"].startswith("real") and rec["dummy_weights"] and rec["concurrency"] == 2, rec
    capsys.readouterr()
    assert cli.main([*base, "--prompt-text", f"{f}:big"]) == 2
    err = capsys.readouterr().err
    assert "vocabulary is 256" in err and "299" in err and "Traceback" not in err, err
    assert cli.main([*base, "--prompt-text", str(tmp_path / "t.txt")]) == 2  # a text file still needs its tokenizer
    assert "needs --model-path" in capsys.readouterr().err
