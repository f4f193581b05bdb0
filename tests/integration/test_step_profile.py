"""experiments/decode_step_profile/step_profile.py: the CPU smoke path (aten ops per decode step, by phase) for dense and lookahead, and the
kernel-trace parser on a hand-made CUDA trace (graph replay, two streams, overlap, a sync)."""

import json

import pytest
from experiment_scripts import load_script

torch = pytest.importorskip("torch")

sp = load_script("decode_step_profile/step_profile.py")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(tmp_path, mode, *extra):
    out = tmp_path / "p.jsonl"
    argv = [
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--mode",
        mode,
        "--context",
        "160",  # beyond the short-context window of (4 + 1) * 16 tokens: the sparse step with its prefetch
        "--concurrency",
        "2",
        "--top-k",
        "4",
        "--kv-budget-gb",
        "0.05",
        "--host-kv-gb",
        "0.01",
        "--warmup",
        "2",
        "--plain-steps",
        "2",
        "--steps",
        "2",
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]
    assert sp.main(argv) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 1
    return recs[0]


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_cpu_smoke_counts_ops_per_step(tmp_path, mode):
    r = _run(tmp_path, mode)
    assert "error" not in r, r.get("error")
    assert r["tool"] == "step_profile" and r["mode"] == mode and r["concurrency"] == 2 and r["n_layers"] == 2
    assert len(r["wall_ms"]) == 2 and all(w > 0 for w in r["wall_ms"])
    assert len(r["wall_ms_plain"]) == 2 and r["wall_ms_plain_p50"] > 0
    assert r["gpu"] is None  # no kernels on the CPU
    h = r["host"]
    assert h["ops_per_step"] >= h["leaf_ops_per_step"] > 0 and h["kernel_like_ops_per_step"] > 0
    assert h["kernel_like_by_step"][0] == h["kernel_like_by_step"][1]  # steady state: the same ops every step
    assert {"gemm", "copy/cast"} <= set(h["op_categories"])
    assert h["top_ops"] and all(o["count_per_step"] > 0 for o in h["top_ops"])
    ph = r["phases"]
    for name in ("qkv", "finish", "attn", "logits", "sample", "layer glue", "step prep"):
        assert ph[name]["kernel_like_ops_per_step"] > 0, name
    # a tiny step: 2 layers, each phase per layer ran once per layer
    assert ph["qkv"]["calls_per_step"] == 2 and ph["finish"]["calls_per_step"] == 2
    assert ph["qkv"]["kernel_like_ops_per_layer"] == ph["qkv"]["kernel_like_ops_per_step"] / 2
    groups = h["op_groups"]
    assert groups["decoder layer"]["kernel_like_ops_per_step"] > 0
    assert groups["attention/KV write"]["kernel_like_ops_per_step"] > 0
    assert groups["sampling/engine"]["kernel_like_ops_per_step"] > 0
    if mode == "lookahead":
        assert groups["prediction+selection+transfer"]["kernel_like_ops_per_step"] > 0
        for name in ("predict", "select", "transfer", "draft", "synthetic_sets"):
            assert ph[name]["kernel_like_ops_per_step"] > 0, name
    else:
        assert "prediction+selection+transfer" not in groups


def test_annotations_are_removed_after_profiling(tmp_path):
    from oasis_exec.tools.bench import build_bench_engine

    a = sp.build_parser().parse_args(
        [
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--mode",
            "lookahead",
            "--context",
            "64",
            "--concurrency",
            "1",
            "--top-k",
            "4",
            "--kv-budget-gb",
            "0.05",
            "--host-kv-gb",
            "0.01",
        ]
    )
    eng, _ = build_bench_engine(sp.make_config(a), 64, 1, 2, 1)
    before = (eng.runner.dec.qkv, eng.sampler, type(eng.runner.model.selector).predict)
    ann = sp.Annotator(eng)
    assert eng.runner.dec.qkv is not before[0]
    ann.remove()
    assert eng.runner.dec.qkv == before[0] and eng.sampler == before[1]
    assert "predict" not in vars(eng.runner.model.selector) and "launch" not in vars(eng.runner.pipe)
    import oasis_exec.ops as ops_mod
    import oasis_exec.workingset.resident as resident_mod

    assert (
        ops_mod.sparse_attn.__module__ == "oasis_exec.ops"
        and resident_mod.writeback_full.__module__ == "oasis_exec.transfer.writeback"
    )
    eng.close()


def _x(name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_parse_trace_kernels_streams_and_graph_replays():
    ev = [
        _x("oasis::step", "user_annotation", 0, 100),
        _x("oasis::step", "user_annotation", 100, 100),
        # step 0: a graph replay whose kernels run on two streams and overlap
        _x("oasis::execute", "user_annotation", 5, 90),
        _x("oasis::graph_replay", "user_annotation", 10, 10),
        _x("cudaGraphLaunch", "cuda_runtime", 12, 5, correlation=1),
        _x("nvjet_hsh_128x256_gemm", "kernel", 30, 10, tid=7, stream=7, correlation=1),
        _x("sparse_attn_kernel", "kernel", 40, 5, tid=7, stream=7, correlation=1),
        _x("uva_gather_kernel", "kernel", 38, 10, tid=9, stream=9, correlation=1),
        # step 1: eager launches inside oasis::qkv, an H2D copy and a sync
        _x("oasis::execute", "user_annotation", 101, 95),
        _x("oasis::decode_core", "user_annotation", 102, 78),
        _x("oasis::qkv", "user_annotation", 105, 10),
        _x("aten::mul", "cpu_op", 108, 4),
        _x("cudaLaunchKernel", "cuda_runtime", 110, 2, correlation=2),
        _x(
            "void at::native::vectorized_elementwise_kernel<4, MulFunctor>",
            "kernel",
            120,
            4,
            tid=7,
            stream=7,
            correlation=2,
        ),
        _x("cudaMemcpyAsync", "cuda_runtime", 150, 3, correlation=3),
        _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 160, 2, tid=7, stream=7, correlation=3),
        _x("cudaStreamSynchronize", "cuda_runtime", 170, 20, correlation=4),
    ]
    gpu, host, phases = sp.parse_trace(ev, n_layers=1)
    st = gpu["steps"]
    assert [s["kernels"] for s in st] == [3, 1] and [s["memcpy_memset"] for s in st] == [0, 1]
    assert st[0]["kernel_ms"] == pytest.approx(0.025) and st[0]["busy_union_ms"] == pytest.approx(0.018)
    assert st[0]["span_ms"] == pytest.approx(0.018) and st[1]["busy_union_ms"] == pytest.approx(0.006)
    assert st[0]["gap_to_next_step_first_kernel_ms"] == pytest.approx(0.072)
    assert gpu["kernels_per_step"] == 2 and gpu["graph_launches_per_step"] == 0.5
    assert gpu["graph_kernels_visible"] is True and gpu["graph_kernels_per_step"] == 1.5
    cats = gpu["categories"]
    assert {"gemm", "attention", "gather (uva/scatter/writeback)", "elementwise/norm/rope", "memcpy/memset"} == set(
        cats
    )
    assert cats["gemm"]["ms_per_step"] == pytest.approx(0.005)
    assert gpu["streams"]["7"]["label"] == "main" and gpu["streams"]["9"]["label"] == "copy"
    assert st[0]["graph_kernels"] == 3 and st[0]["graph_start_after_step_start_ms"] == pytest.approx(0.03)
    assert st[0]["graph_end_before_step_end_ms"] == pytest.approx(0.052) and "graph_kernels" not in st[1]
    assert gpu["phases"]["graph_replay"]["count_per_step"] == 1.5 and gpu["phases"]["qkv"]["count_per_step"] == 0.5
    assert gpu["top_kernels"][0]["name"] == "nvjet_hsh_128x256_gemm" or gpu["top_kernels"][0]["us_per_step"] == 5.0
    assert host["sync_ms_per_step"] == [0.0, 0.02]
    assert host["runtime_api"]["cudaGraphLaunch"]["count_per_step"] == 0.5
    assert phases["qkv"]["kernel_like_ops_per_step"] == 0.5 and phases["qkv"]["group"] == "decoder layer"


def test_from_trace_reparses_a_saved_trace(tmp_path, capsys):
    trace = tmp_path / "t.json.gz"
    r = _run(tmp_path, "dense", "--trace-out", str(trace))
    out = tmp_path / "again.jsonl"
    assert sp.main(["--from-trace", str(trace), "--n-layers", "2", "--out", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again["host"]["kernel_like_by_step"] == r["host"]["kernel_like_by_step"]
    assert again["phases"]["qkv"] == r["phases"]["qkv"]
    assert "kernel-like" in capsys.readouterr().out


def test_categories():
    assert sp.kernel_category("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>") == "gemm"
    assert sp.kernel_category("paged_attn_kernel") == "attention"
    assert sp.kernel_category("ring_attn_kernel") == "attention"
    assert sp.kernel_category("splitk_merge_kernel") == "attention"
    assert sp.kernel_category("block_score_kernel") == "score/topk/sort"
    assert sp.kernel_category("void at::native::index_elementwise_kernel<128, 4>") == "index (torch gather/scatter)"
    assert sp.kernel_category("void at::native::reduce_kernel<512, 1>") == "elementwise/norm/rope"
    assert sp.kernel_category("Memset (Device)") == "memcpy/memset"
    assert sp.op_category("aten::mm") == "gemm" and sp.op_category("aten::view") == "view/alloc (no kernel)"


def test_a_decode_chain_profiles_its_passes_in_one_step(tmp_path):
    """--decode-chain 4: each profiled engine step runs four decode passes (about four times a single step's ops)."""
    one = _run(tmp_path, "lookahead")
    (tmp_path / "p.jsonl").unlink()
    four = _run(tmp_path, "lookahead", "--decode-chain", "4")
    assert (one["decode_chain"], four["decode_chain"]) == (1, 4)
    assert four["host"]["kernel_like_ops_per_step"] > 3 * one["host"]["kernel_like_ops_per_step"]
