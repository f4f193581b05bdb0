"""Fuzz the simulator's command lines: random argument vectors (fixed seed) of valid and invalid values, unknown
options, extreme numbers and bad paths, run in-process through each CLI's ``main``. Every one must exit 0 or 2,
and an exit 2 must print exactly one line on stderr and no traceback. Runs are tiny (a 2-request trace)."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oasis_core import importers
from oasis_sim import cli

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "traces" / "recordings" / "dense-8k-c8.json"

NUMBERS = [
    "0",
    "1",
    "2",
    "-1",
    "0.5",
    "1e9",
    "1000000000",
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "abc",
    "",
    "3",
    "99999999999999999999999",
]
TINY = ["--max-requests", "2", "--policy-layers", "1", "--profile-steps", "4", "--timeline-steps", "0", "--quiet"]
RUN_OPTIONS = {
    "--top-k": NUMBERS,
    "--block-size": NUMBERS,
    "--fetch-ratio": NUMBERS,
    "--seed": NUMBERS,
    "--max-requests": ["1", "2", "0", "-3", "x"],
    "--time-scale": NUMBERS,
    "--max-context": NUMBERS,
    "--max-batch": NUMBERS,
    "--chunk-tokens": ["1", "64", "0", "1e9", "1000000000"],
    "--hbm-utilization": NUMBERS,
    "--hbm-bytes": NUMBERS,
    "--host-bytes": NUMBERS,
    "--draft-state-bytes": NUMBERS,
    "--h2d-bytes-per-s": NUMBERS,
    "--gather-sm-share": NUMBERS,
    "--policy-layers": ["1", "2", "0", "100000", "1000000000"],
    "--profile-steps": ["2", "4", "1", "1e8", "100000000"],
    "--timeline-steps": ["0", "3", "-1", "1000000000"],
    "--rate-rps": NUMBERS + ["1e-300", "1e300"],
    "--concurrency": ["1", "2", "0", "1000000000"],
    "--mode": ["dense", "lookahead", "proxy", "quest", "retrieval", "nope"],
    "--arrival": ["trace", "closed", "poisson", "x"],
    "--split": ["none", "full", "rpf", "x"],
    "--policy-sampling": ["profile", "exact", "x"],
    "--transfer-path": ["dma", "uva", "x"],
    "--event-mode": ["closed", "events", "x"],
    "--selection": ["synthetic", "replay"],
    "--replay-file": ["/nonexistent.json", str(RECORDING), "."],
    "--fetch-policy": ["budget:0.8", "fixed:0.1", "x:y"],
    "--model": ["qwen3-8b", "nope"],
    "--hardware": ["h100-sxm", "nope"],
    "--nic": ["roce-400g", "nope"],
    "--syn-drift-rate": NUMBERS,
    "--syn-preset": ["paper", "smollm2", "x"],
    "--prefix-cache": None,
    "--no-prefix-cache": None,
    "--prefix-cache-hbm-bytes": NUMBERS,
    "--config": ["/nonexistent.yaml", str(RECORDING), "."],
    "--bogus": None,
    "-x": None,
}


MAX_ERR_CHARS = 2500  # issue 35: an error line is bounded whatever the input (one_line caps it at 1,000 + a note)


def _assert_clean(rc, err):
    assert rc in (0, 2), (rc, err[:3000])
    assert "Traceback" not in err, err[:3000]
    if rc == 2:
        assert err.count("\n") == 1 and err.strip(), err[:3000]
        assert len(err) < MAX_ERR_CHARS, f"{len(err)} characters: {err[:300]}"


def _mutations(rng, options, n):
    out = []
    for flag in rng.sample(sorted(options), n):
        values = options[flag]
        out += [flag] if values is None else [flag, rng.choice(values)]
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    trace = d / "t.json"
    trace.write_text(
        json.dumps(
            {
                "schema": "oasiskv-trace",
                "version": 1,
                "requests": [
                    {
                        "id": 0,
                        "arrival_s": 0.0,
                        "prompt_tokens": 600,
                        "output_tokens": 3,
                        "prefix_block_ids": [1],
                        "prefix_block_tokens": 512,
                    },
                    {
                        "id": 1,
                        "arrival_s": 0.1,
                        "prompt_tokens": 900,
                        "output_tokens": 2,
                        "prefix_block_ids": [1],
                        "prefix_block_tokens": 512,
                    },
                ],
            }
        )
    )
    mooncake = d / "m.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [0, 1]}\n'
        '{"timestamp": 3000, "input_length": 700, "output_length": 2, "hash_ids": [0, 5]}\n'
    )
    azure = d / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
    )
    afile = d / "afile"
    afile.write_text("x")
    grid = d / "g.yaml"
    grid.write_text(
        f"trace: {trace}\nbase: {{max_requests: 2, policy_layers: 1, profile_steps: 4, "
        "timeline_steps: 0}\ngrid:\n  mode: [dense, lookahead]\n"
    )
    bad_grid = d / "bad.yaml"
    bad_grid.write_text(
        f"trace: {trace}\nbase: {{max_requests: 2, policy_layers: 1, profile_steps: 4}}\n"
        "grid:\n  top_k: [16, 1000000000]\n"
    )
    # issue 35, classes 1-3: inputs that once ended in 28 MB messages, runaway grids or tracebacks
    bomb = d / "bomb.yaml"
    bomb.write_text(
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\ntop_k: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    )
    long_value = d / "long.yaml"
    long_value.write_text("top_k: [" + ", ".join(["-1"] * 50_000) + "]\nmode: " + "x" * 100_000 + "\n")
    huge_grid = d / "huge.yaml"
    huge_grid.write_text(
        f"trace: {trace}\ngrid:\n"
        + "".join(
            f"  {k}: [{', '.join(map(str, range(1, 101)))}]\n"
            for k in ("top_k", "seed", "block_size", "max_batch", "chunk_tokens")
        )
    )
    bomb_grid = d / "bombgrid.yaml"
    bomb_grid.write_text(bomb.read_text().replace("top_k: [", "grid:\n  top_k: ["))
    garbage = d / "garbage.npz"
    garbage.write_bytes(bytes(range(256)) * 8)
    cut = d / "cut.json"
    cut.write_bytes(RECORDING.read_bytes()[:1000])
    nested = d / "nested.json"
    nested.write_text("[" * 100_000)
    return {
        "bomb": str(bomb),
        "long_value": str(long_value),
        "huge_grid": str(huge_grid),
        "bomb_grid": str(bomb_grid),
        "garbage": str(garbage),
        "cut": str(cut),
        "nested": str(nested),
        "dir": d,
        "trace": str(trace),
        "mooncake": str(mooncake),
        "azure": str(azure),
        "afile": str(afile),
        "grid": str(grid),
        "bad_grid": str(bad_grid),
    }


def _paths(files, rng):
    return rng.choice(
        [files["trace"], files["afile"], str(files["dir"]), "/nonexistent/x", files["mooncake"], str(RECORDING), ""]
    )


def _out(files, rng, i):
    d = files["dir"]
    return rng.choice([str(d / f"out{i}"), files["afile"], str(Path(files["afile"]) / "sub"), "/proc/x"])


def _sim_vectors(files):
    rng = random.Random(15)
    vectors = [[], ["--help"], ["nope"], ["run", "--bogus"], ["sweep"], ["import", "mooncake"]]
    for i in range(60):
        trace = [files["trace"]] if rng.random() < 0.8 else [_paths(files, rng)]
        out = str(files["dir"] / f"run{i}") if rng.random() < 0.8 else _out(files, rng, i)
        vectors.append(["run", *trace, *TINY, "--out", out, *_mutations(rng, RUN_OPTIONS, rng.randint(1, 3))])
    for i in range(12):
        kind = rng.choice(["mooncake", "azure", "parquet"])
        src = rng.choice([files["mooncake"], files["azure"], files["trace"], "/nonexistent", str(files["dir"])])
        opts = _mutations(
            rng,
            {
                "--limit": NUMBERS,
                "--time-scale": NUMBERS,
                "--max-context": NUMBERS,
                "--seed": NUMBERS,
                "--spread": ["auto", "uniform", "even", "none", "x"],
                "--overflow": ["clip", "drop", "x"],
                "--model": ["qwen3-8b", "nope"],
                "--bogus": None,
            },
            rng.randint(0, 3),
        )
        vectors.append(
            [
                "import",
                kind,
                src,
                "-o",
                rng.choice([str(files["dir"] / f"imp{i}.json"), str(files["dir"]), "/nonexistent/x.json"]),
                *opts,
            ]
        )
    for i in range(6):
        grid = rng.choice([files["grid"], files["bad_grid"], files["trace"], "/nonexistent.yaml"])
        workers = rng.choice([[], ["--workers", "1"], ["--workers", "-1"], ["--workers", "0"], ["--workers", "x"]])
        vectors.append(
            [
                "sweep",
                grid,
                "--out",
                str(files["dir"] / f"sw{i}") if rng.random() < 0.7 else _out(files, rng, i),
                *workers,
            ]
        )
    for i in range(8):
        cmd = rng.choice(["replay", "validate"])
        rec = rng.choice([str(RECORDING), files["trace"], files["afile"], "/nonexistent.json", str(files["dir"])])
        extra = rng.choice(
            [
                [],
                ["--calibrate-from", str(RECORDING)],
                ["--calibrate-from", "/nonexistent"],
                ["--no-selection"],
                ["--bogus"],
            ]
        )
        if cmd == "validate":
            extra = [x for x in extra if x != "--no-selection"] + ["--quiet"]
        vectors.append(
            [cmd, rec, "--out", str(files["dir"] / f"{cmd}{i}") if rng.random() < 0.7 else _out(files, rng, i), *extra]
        )
    return vectors + _hostile_vectors(files)


def _hostile_vectors(files):
    """Issue 35, classes 1-3, every command: alias bombs, values of 100,000 characters, a grid of 10^10 points,
    corrupt binary and JSON files wherever a file is read."""
    d = files["dir"]
    run = ["run", files["trace"], *TINY, "--out", str(d / "hostile")]
    corrupt = [files["garbage"], files["cut"], files["nested"]]
    out = [[*run, "--config", files[k]] for k in ("bomb", "long_value", "nested", "garbage", "cut")]
    out += [[*run, "--selection", "replay", "--replay-file", f] for f in corrupt]
    out += [["run", f, *TINY, "--out", str(d / "hostile")] for f in corrupt]
    huge = "x" * 100_000
    out.append(["run", files["trace"], *TINY, "--out", str(d / ("d/" * 1500))])  # os.makedirs recursed past its limit
    for flag in ("--fetch-policy", "--model", "--hardware", "--mode", "--syn-preset", "--top-k", "--seed"):
        out.append([*run, flag, huge])
    out += [["sweep", files[k], "--out", str(d / "hostile_sw")] for k in ("huge_grid", "bomb_grid", "nested")]
    out += [["sweep", files["garbage"], "--out", str(d / "hostile_sw")]]
    for cmd in ("replay", "validate"):
        out += [
            [cmd, f, "--out", str(d / f"hostile_{cmd}")] + (["--quiet"] if cmd == "validate" else []) for f in corrupt
        ]
    out += [["validate", str(RECORDING), "--calibrate-from", files["garbage"], "--quiet", "--out", str(d / "hv")]]
    for kind in ("mooncake", "azure"):
        out += [["import", kind, f, "-o", str(d / "hostile.json")] for f in corrupt]
    return out


def test_fuzz_oasis_sim(files, capsys):
    codes = {}
    for argv in _sim_vectors(files):
        try:
            rc = cli.main(argv)
        except BaseException as e:  # noqa: BLE001 - anything escaping main is the failure under test
            pytest.fail(f"{argv}: {type(e).__name__}: {e}")
        _assert_clean(rc, capsys.readouterr().err)
        codes.setdefault((argv[0] if argv else "", rc), 0)
        codes[(argv[0] if argv else "", rc)] += 1
    # the vectors reach the work itself, not only the option checks: every command both succeeds and fails
    for cmd in ("run", "import", "sweep", "replay", "validate"):
        assert codes.get((cmd, 0)) and codes.get((cmd, 2)), codes


def test_fuzz_importer_module(files, capsys):
    rng = random.Random(16)
    options = {
        "--limit": NUMBERS,
        "--time-scale": NUMBERS,
        "--max-context": NUMBERS,
        "--seed": NUMBERS,
        "--spread": ["auto", "uniform", "even", "none", "x"],
        "--overflow": ["clip", "drop", "x"],
        "--model": ["qwen3-8b", "nope"],
        "--bogus": None,
        "--help": None,
    }
    vectors = [[], ["mooncake"], ["azure", files["azure"]]]
    for i in range(40):
        src = rng.choice([files["mooncake"], files["azure"], files["trace"], "/nonexistent", str(files["dir"])])
        out = rng.choice(
            [
                str(files["dir"] / f"m{i}.json"),
                str(files["dir"]),
                "/nonexistent/x.json",
                str(Path(files["afile"]) / "x.json"),
            ]
        )
        vectors.append(
            [rng.choice(["mooncake", "azure", "x"]), src, "--out", out, *_mutations(rng, options, rng.randint(0, 3))]
        )
    codes = []
    for argv in vectors:
        try:
            rc = importers.main(argv)
        except BaseException as e:  # noqa: BLE001
            pytest.fail(f"{argv}: {type(e).__name__}: {e}")
        _assert_clean(rc, capsys.readouterr().err)
        codes.append(rc)
    assert codes.count(0) >= 3 and codes.count(2) >= 3, codes


def test_a_point_failing_in_a_worker_is_named(files, capsys):
    out = files["dir"] / "swbad"
    assert cli.main(["sweep", files["bad_grid"], "--out", str(out), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 points failed" in err and "point 1 (top_k=1000000000)" in err and "GiB" in err
    import pandas as pd

    df = pd.read_csv(out / "sweep.csv", keep_default_na=False)
    assert df["error"].tolist()[0] == "" and df["error"].tolist()[1].startswith("ConfigError: top_k:")


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{trace}", *TINY[:-1], "--out", "{dir}/pipe_run"],
        ["import", "mooncake", "{mooncake}", "-o", "{dir}/pipe.json"],
        ["sweep", "{grid}", "--out", "{dir}/pipe_sw", "--workers", "1"],
        ["replay", str(RECORDING), "--out", "{dir}/pipe_rp"],
        ["validate", str(RECORDING), str(RECORDING.with_name("dense-8k-c16.json")), "--out", "{dir}/pipe_va"],
    ],
    ids=["run", "import", "sweep", "replay", "validate"],
)
def test_closed_stdout_is_quiet(files, argv):
    """``... | head -0``: stdout closed before the command prints; exit 0 and nothing on stderr but progress."""
    argv = [a.format(**files) for a in argv]
    for module in (["oasis_sim"], ["oasis_core.importers"]) if argv[0] == "import" else (["oasis_sim"],):
        args = argv[1:] if module == ["oasis_core.importers"] else argv
        if module == ["oasis_core.importers"]:
            args = [a if a != "-o" else "--out" for a in args]
        p = subprocess.Popen(
            [sys.executable, "-m", *module, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        )
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait() == 0, err
        assert "Traceback" not in err and "Error" not in err, err
    shutil.rmtree(files["dir"] / "pipe_run", ignore_errors=True)
