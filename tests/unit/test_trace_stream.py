"""The streaming trace reader (oasis_core.trace_stream) returns what the strict loader returns, at every chunk size
(numbers, strings and multi-byte characters cut at chunk boundaries), and for a bad file gives the strict loader's
error word for word; the simulator streams large traces."""

import json
import random

import pytest

from oasis_core.trace import Trace, TraceError, TraceRequest, dumps_trace, load_trace, save_trace
from oasis_core.trace_stream import load_trace_stream
from oasis_sim import workloads

CHUNKS = [1, 2, 3, 7, 64, 1 << 20]


def _trace(n=40, seed=0):
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rng.random() * 3
        reqs.append(TraceRequest(i, round(t, 6), rng.randint(1, 20000), rng.randint(1, 900)))
    return Trace(requests=reqs, meta={"source": "tést ✓ 測試", "n": n}, config={"k": [1, 2.5, None]})


def _strict(p):
    from oasis_core.trace import loads_trace

    return loads_trace(p.read_bytes(), str(p))


def _same(a, b):
    assert a.requests == b.requests and a.meta == b.meta and a.config == b.config and a.results == b.results


@pytest.fixture
def no_fallback(monkeypatch):
    """Valid files must be read by the stream itself, not handed to the strict loader."""
    import oasis_core.trace_stream as ts

    def refuse(path):
        raise AssertionError(f"the stream gave up on a valid file: {path}")

    monkeypatch.setattr(ts._t, "load_trace", refuse)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_streamed_equals_strict_on_valid_files(tmp_path, chunk, no_fallback):
    p = tmp_path / "t.json"
    save_trace(_trace(), p)
    seen = []
    streamed = load_trace_stream(p, chunk_bytes=chunk, progress=seen.append)
    _same(streamed, _strict(p))
    assert sum(seen) == p.stat().st_size


def test_key_order_and_whitespace_do_not_matter(tmp_path, no_fallback):
    obj = json.loads(dumps_trace(_trace(5)))
    p = tmp_path / "t.json"
    p.write_text(json.dumps(dict(reversed(list(obj.items()))), indent=3))  # requests before schema, pretty
    for chunk in (1, 5, 4096):
        _same(load_trace_stream(p, chunk_bytes=chunk), _strict(p))


BAD = [
    "",
    "   ",
    "[]",
    '{"schema": "oasiskv-trace", "version": 1}',
    '{"requests": [{"id": 0}], "schema": "x", "version": 1}',
    "{not json",
    '{"schema": "oasiskv-trace", "version": 1, "requests": [{"id": 0, "arrival_s": NaN}]}',
    '{"schema": "oasiskv-trace", "version": 1, "version": 1, "requests": []}',
    '{"schema": "oasiskv-trace", "version": 1, "requests": []}',
    '{"schema": "oasiskv-trace", "version": 1, "requests": 5}',
]


def _reorder(text):
    """Two requests' arrivals swapped: every request is valid alone, the order check fails at the end."""
    obj = json.loads(text)
    r = obj["requests"]
    r[2]["arrival_s"], r[3]["arrival_s"] = r[3]["arrival_s"], r[2]["arrival_s"]
    return json.dumps(obj)


@pytest.mark.parametrize("text", BAD + ["TRUNCATED", "TRAILING", "BADREQ", "UNORDERED", "LATIN1"])
def test_errors_are_the_strict_loaders(tmp_path, text):
    good = dumps_trace(_trace(6))
    text = {
        "TRUNCATED": good[: len(good) // 2],
        "TRAILING": good + " {}",
        "BADREQ": good.replace('"output_tokens":', '"output_tokens":-', 1),
        "UNORDERED": _reorder(good),
    }.get(text, text)
    p = tmp_path / "t.json"
    p.write_bytes(b"\xe9\xff{" if text == "LATIN1" else text.encode())
    with pytest.raises(TraceError) as strict:
        load_trace(p)
    for chunk in (1, 3, 1 << 20):
        with pytest.raises(TraceError) as streamed:
            load_trace_stream(p, chunk_bytes=chunk)
        assert str(streamed.value) == str(strict.value)


def test_simulator_streams_traces_past_the_threshold(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    save_trace(_trace(), p)
    calls = []
    real = workloads._load_large
    monkeypatch.setattr(workloads, "_load_large", lambda path, size: calls.append(path) or real(path, size))
    monkeypatch.setattr(workloads, "PROGRESS_BYTES", 1)
    _same(workloads.load_workload(p), load_trace(p))
    assert calls == [p]


def test_an_unreadable_file_is_the_strict_loaders_error(tmp_path):
    p = tmp_path / "missing.json"
    with pytest.raises(TraceError) as strict:
        load_trace(p)
    with pytest.raises(TraceError) as streamed:
        load_trace_stream(p)
    assert str(streamed.value) == str(strict.value) and "cannot read" in str(strict.value)
