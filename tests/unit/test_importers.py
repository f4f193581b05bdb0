import json
from pathlib import Path

import numpy as np
import pytest

from oasis_core.importers import fit_context, import_azure, import_mooncake, main, spread_buckets
from oasis_core.trace import TraceError, load_trace

REPO = Path(__file__).resolve().parents[2]
PUBLIC = REPO / "traces" / "public"  # the published files, copied unchanged (traces/public/README.md)
MOONCAKE = PUBLIC / "mooncake_conversation_trace.jsonl"
AZURE = PUBLIC / "azure2023_code.csv"

needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason=f"public trace not found at {MOONCAKE}")
needs_azure = pytest.mark.skipif(not AZURE.exists(), reason=f"public trace not found at {AZURE}")


@pytest.fixture(scope="module")
def mooncake():
    return import_mooncake(MOONCAKE)


@pytest.fixture(scope="module")
def azure():
    return import_azure(AZURE)


# ----------------------------------------------------------------------------------------------------------------
# Real files, statistics from the traces' published descriptions


@needs_mooncake
def test_mooncake_full_file(mooncake):
    reqs = mooncake.requests
    assert len(reqs) == 12_031
    assert [r.id for r in reqs[:3]] == [0, 1, 2]
    prompt = np.array([r.prompt_tokens for r in reqs])
    output = np.array([r.output_tokens for r in reqs])
    assert round(prompt.mean()) == 12_035 and np.median(prompt) == 6_909
    assert (prompt.min(), prompt.max()) == (891, 126_195)
    assert round(output.mean()) == 343 and (output.min(), output.max()) == (1, 2_000)
    n_blocks = np.array([len(r.prefix_block_ids) for r in reqs])
    assert n_blocks.sum() == 288_500 and n_blocks.max() == 247
    assert len({b for r in reqs for b in r.prefix_block_ids}) == 182_790
    assert all(r.prefix_block_ids[0] == 0 and r.prefix_block_tokens == 512 for r in reqs)
    assert reqs[0].prefix_block_ids == tuple(range(14))


@needs_mooncake
def test_mooncake_arrivals_are_spread_within_their_bucket(mooncake):
    raw_ms = np.array([json.loads(line)["timestamp"] for line in MOONCAKE.read_text().splitlines()])
    arrivals = np.array([r.arrival_s for r in mooncake.requests])
    assert np.all(np.diff(arrivals) >= 0)
    assert len(np.unique(raw_ms)) == 1_180 and len(np.unique(arrivals)) == 12_031  # buckets broken up
    # every arrival stays inside its own bucket [t, next distinct t)
    starts = np.unique(raw_ms) / 1000.0
    bucket = np.searchsorted(starts, raw_ms / 1000.0)
    assert np.all(arrivals >= starts[bucket])
    assert np.all(arrivals[bucket < len(starts) - 1] < starts[bucket[bucket < len(starts) - 1] + 1])
    duration = arrivals[-1] - arrivals[0]
    assert 3_537 <= duration < 3_537 + 3.01


@needs_mooncake
def test_mooncake_options(mooncake):
    head = import_mooncake(MOONCAKE, limit=200)
    assert head.requests == mooncake.requests[:200]
    assert import_mooncake(MOONCAKE, limit=50, seed=1).requests[5].arrival_s != head.requests[5].arrival_s
    assert import_mooncake(MOONCAKE, limit=50, seed=0) == import_mooncake(MOONCAKE, limit=50, seed=0)
    fast = import_mooncake(MOONCAKE, limit=200, time_scale=0.5)
    assert [r.arrival_s for r in fast.requests] == pytest.approx([r.arrival_s / 2 for r in head.requests], abs=2e-6)
    even = import_mooncake(MOONCAKE, limit=10, spread="even")
    assert [r.arrival_s for r in even.requests[:3]] == [0.0, 0.3, 0.6]  # 10 requests share the first 3 s bucket
    clipped = import_mooncake(MOONCAKE, max_context=40_960)
    assert len(clipped.requests) == 12_031
    assert max(r.total_tokens for r in clipped.requests) == 40_960
    for r in clipped.requests:
        assert len(r.prefix_block_ids) == -(-r.prompt_tokens // 512)
    dropped = import_mooncake(MOONCAKE, max_context=40_960, overflow="drop")
    kept = [r for r in mooncake.requests if r.total_tokens <= 40_960]
    assert dropped.requests == tuple(kept) and 11_000 < len(kept) < 12_031


@needs_azure
def test_azure_full_file(azure):
    reqs = azure.requests
    assert len(reqs) == 8_819
    prompt = np.array([r.prompt_tokens for r in reqs])
    output = np.array([r.output_tokens for r in reqs])
    assert round(prompt.mean()) == 2_048 and np.median(prompt) == 1_469 and prompt.max() == 7_437
    assert round(output.mean(), 1) == 27.9 and np.median(output) == 13 and output.max() == 1_899
    arrivals = np.array([r.arrival_s for r in reqs])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    # 18:17:03.9799600 -> 18:17:04.0319600; span 18:17:03.98 to 19:14:19.93 (3,436 s)
    assert arrivals[1] == pytest.approx(0.052, abs=1e-6)
    assert round(arrivals[-1]) == 3_436
    assert azure.meta["start"] == "2023-11-16 18:17:03.9799600"
    limited = import_azure(AZURE, limit=100, time_scale=2.0, max_context=2_048)
    assert len(limited.requests) == 100 and limited.requests[1].arrival_s == pytest.approx(0.104, abs=1e-6)
    assert max(r.total_tokens for r in limited.requests) == 2_048


@needs_mooncake
def test_bundled_slice_is_what_the_documented_command_produces(tmp_path):
    out = tmp_path / "slice.json"
    assert main(["mooncake", str(MOONCAKE), "--limit", "200", "--model", "qwen3-8b", "--out", str(out)]) == 0
    assert out.read_bytes() == (REPO / "traces" / "mooncake_slice.json").read_bytes()
    trace = load_trace(out)
    assert len(trace.requests) == 200 and max(r.total_tokens for r in trace.requests) <= 40_960


# ----------------------------------------------------------------------------------------------------------------
# Source-file errors name file, line and field


def test_fit_context():
    assert fit_context(100, 10, None) == (100, 10)
    assert fit_context(100, 10, 110) == (100, 10)
    assert fit_context(100, 10, 50) == (40, 10)
    assert fit_context(100, 60, 50) == (1, 49)


def test_spread_buckets_exact():
    assert spread_buckets([0, 0, 0, 3, 3, 6], "even").tolist() == [0, 1, 2, 3, 4.5, 6]
    assert spread_buckets([0, 0, 3], "none").tolist() == [0, 0, 3]
    u = spread_buckets([0, 0, 0, 3, 3, 6, 6], "uniform", seed=5)
    assert np.all(np.diff(u) >= 0) and np.all(u[:3] < 3) and np.all((u[3:5] >= 3) & (u[3:5] < 6)) and u[5] >= 6
    assert np.array_equal(u, spread_buckets([0, 0, 0, 3, 3, 6, 6], "uniform", seed=5))


def _jsonl(tmp_path, rows):
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({**GOOD, "output_length": 0}, "line 2: output_length: must be >= 1, got 0"),
        ({**GOOD, "input_length": "600"}, 'line 2: input_length: must be an integer, got "600" (string)'),
        ({k: v for k, v in GOOD.items() if k != "timestamp"}, "line 2: timestamp: missing required field"),
        (
            {**GOOD, "hash_ids": [0, 1, 2]},
            "line 2: hash_ids: must cover at most input_length = 600 tokens in 512-token blocks, got 3 blocks",
        ),
        ({**GOOD, "hash_ids": [0, True]}, "line 2: hash_ids: must be an array of integers >= 0, got [0, true]"),
        ('{"timestamp": 0, "input_len', "line 2: invalid JSON: Unterminated string starting at"),
        ("[1]", "line 2: must be a JSON object, got [1] (array)"),
    ],
)
def test_mooncake_row_errors(tmp_path, bad_row, message):
    path = _jsonl(tmp_path, [{**GOOD, "timestamp": 0}, bad_row])
    with pytest.raises(TraceError) as e:
        import_mooncake(path)
    assert str(e.value) == f"{path}: {message}"


def test_mooncake_time_going_back_and_empty(tmp_path):
    path = _jsonl(tmp_path, [{**GOOD, "timestamp": 3000}, {**GOOD, "timestamp": 0}])
    with pytest.raises(TraceError) as e:
        import_mooncake(path)
    assert str(e.value) == f"{path}: line 2: timestamp: must be >= the previous row's 3000, got 0"
    path.write_text("\n\n")
    with pytest.raises(TraceError) as e:
        import_mooncake(path)
    assert str(e.value) == f"{path}: empty file"
    with pytest.raises(TraceError) as e:
        import_mooncake(tmp_path / "missing.jsonl")
    assert str(e.value) == f"{tmp_path / 'missing.jsonl'}: cannot read: No such file or directory"


def test_importer_option_errors(tmp_path):
    path = _jsonl(tmp_path, [GOOD])
    for kwargs, message in [
        ({"time_scale": 0}, "time_scale: must be a finite number > 0, got 0"),
        ({"limit": 0}, "limit: must be None or an integer >= 1, got 0"),
        ({"spread": "wide"}, "spread: must be one of auto, uniform, even, none, got 'wide'"),
    ]:
        with pytest.raises(ValueError) as e:
            import_mooncake(path, **kwargs)
        assert str(e.value) == message
    with pytest.raises(TraceError) as e:
        import_mooncake(path, max_context=100, overflow="drop")
    assert str(e.value) == f"{path}: every request is longer than max_context = 100 (overflow='drop')"


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.03,3180,0"],
            "line 3: GeneratedTokens: must be >= 1, got 0",
        ),
        (
            ["2023-11-16 18:17:03.9799600,4808,10", "yesterday,3180,8"],
            "line 3: TIMESTAMP: must be 'YYYY-MM-DD HH:MM:SS.fffffff', got \"yesterday\"",
        ),
        (
            ["2023-11-16 18:17:03.9799600,4808,10", "2023-11-16 18:17:04.0319600,31.5,8"],
            'line 3: ContextTokens: must be an integer, got "31.5"',
        ),
        (
            ["2023-11-16 18:17:05.0000000,4808,10", "2023-11-16 18:17:04.0319600,3180,8"],
            "line 3: TIMESTAMP: must be >= the previous row's 2023-11-16 18:17:05.0000000, got 2023-11-16 18:17:04.0319600",
        ),
    ],
)
def test_azure_row_errors(tmp_path, rows, message):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    with pytest.raises(TraceError) as e:
        import_azure(path)
    assert str(e.value) == f"{path}: {message}"


def test_azure_header_and_empty(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n")
    with pytest.raises(TraceError) as e:
        import_azure(path)
    assert str(e.value) == f"{path}: line 1: GeneratedTokens: missing column (header has: TIMESTAMP, ContextTokens)"
    path.write_text("")
    with pytest.raises(TraceError) as e:
        import_azure(path)
    assert str(e.value) == f"{path}: empty file"


def test_mooncake_limit_reads_only_what_it_needs(tmp_path):
    # limit=2 needs the whole first bucket (t=0, 3 rows) and one row of the next one; the broken last line is
    # never read, and the first arrivals equal those of a full import.
    rows = [GOOD, GOOD, GOOD, {**GOOD, "timestamp": 3000}, {**GOOD, "timestamp": 6000}]
    full = import_mooncake(_jsonl(tmp_path, rows))
    path = _jsonl(tmp_path, rows[:4] + ["not json"])
    head = import_mooncake(path, limit=2)
    assert [r.id for r in head.requests] == [0, 1]
    assert head.requests == full.requests[:2]
    with pytest.raises(TraceError) as e:
        import_mooncake(path)
    assert str(e.value).startswith(f"{path}: line 5: invalid JSON: ")
