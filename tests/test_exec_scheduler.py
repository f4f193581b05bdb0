"""The executor's scheduler is torch-free: admission by lanes and host blocks, chunked prefill, retirement."""
import subprocess
import sys

from oasis_exec.scheduler import SamplingParams, Scheduler


def test_scheduler_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import oasis_exec.scheduler as s; "
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_admission_chunked_prefill_and_retirement():
    s = Scheduler(max_lanes=2, host_blocks=10, block_size=16, prefill_chunk=32)
    a = s.add(list(range(70)), SamplingParams(max_tokens=10))  # needs ceil(80/16) = 5 host blocks
    b = s.add(list(range(20)), SamplingParams(max_tokens=12))  # needs 2
    c = s.add(list(range(60)), SamplingParams(max_tokens=4))  # needs 4: waits for host blocks
    p = s.schedule()
    assert [(x.req_id, x.lane, len(x.host_blocks)) for x in p.admit] == [(a, 0, 5), (b, 1, 2)]
    assert p.admit[0].host_blocks == (0, 1, 2, 3, 4)
    assert (p.prefill.req_id, p.prefill.start, len(p.prefill.tokens), p.prefill.last) == (a, 0, 32, False)
    s.update(p, {})
    p = s.schedule()
    assert (p.prefill.start, len(p.prefill.tokens), p.prefill.last) == (32, 32, False)
    s.update(p, {})
    p = s.schedule()
    assert (p.prefill.start, len(p.prefill.tokens), p.prefill.last) == (64, 6, True)
    s.update(p, {a: 5})
    p = s.schedule()
    assert p.prefill.req_id == b and p.prefill.last
    s.update(p, {b: 9})
    p = s.schedule()
    assert [(d.req_id, d.token, d.position) for d in p.decode] == [(a, 5, 70), (b, 9, 20)]
    assert not p.admit  # c needs 4 blocks, 3 are free
    for _ in range(9):
        s.update(p, {a: 1, b: 2})
        p = s.schedule()
    assert s.finished[a].finish_reason == "length" and len(s.finished[a].output) == 10
    assert [x.req_id for x in p.admit] == [c] and p.admit[0].lane == 0 and p.release == (0,)


def test_stop_and_abort_free_resources():
    s = Scheduler(max_lanes=1, host_blocks=4, block_size=16)
    a = s.add([1, 2, 3], SamplingParams(max_tokens=8, stop_ids=(42,)), synthetic_prefill=True)
    p = s.schedule()
    assert p.prefill is None and [(d.token, d.position) for d in p.decode] == [(3, 2)]
    s.update(p, {a: 42})
    assert s.finished[a].finish_reason == "stop" and s.free_lanes == [0] and len(s.free_host) == 4
    b = s.add([1, 2], SamplingParams(max_tokens=8))
    s.schedule()
    assert s.abort(b) and s.free_lanes == [0] and not s.abort(b)


def test_bench_cli_writes_a_record(tmp_path):
    import json

    from oasis_exec.__main__ import main

    out = tmp_path / "r.json"
    main(["bench", "--model", "tiny", "--device", "cpu", "--dtype", "float32", "--mode", "lookahead", "--context",
          "300", "--concurrency", "2", "--steps", "4", "--warmup", "1", "--top-k", "8", "--kv-budget-gb", "0.01",
          "--selection", "synthetic", "--out", str(out)])
    rec = json.loads(out.read_text().splitlines()[-1])
    for k in ("mode", "context", "concurrency", "kv_budget_gb", "throughput_tok_s", "tpot_ms_p50", "tpot_ms_p99",
              "bytes_moved_per_step", "hidden_fraction", "peak_gpu_bytes", "peak_host_bytes", "selection", "device",
              "date", "commit"):
        assert k in rec
    assert rec["concurrency"] == 2 and rec["steps"] == 4 and rec["selection"] == "synthetic"
