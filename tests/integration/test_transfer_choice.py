"""The engine's measured transfer-path choice (oasis_exec.transfer.choice) and experiments/transfer_paths/transfer_paths.py.

The summarize test feeds fabricated records: it checks the arithmetic of the report, it is not a result."""

import json
import os
import re
import warnings

import pytest
from experiment_scripts import load_script

from oasis_exec.transfer import choice as tc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    return load_script("transfer_paths/transfer_paths.py")


TABLE = {
    "source": "synthetic test table",
    "device": "test",
    "date": "2026-12-01",
    "commit": "abc",
    "choices": [
        {"concurrency": 8, "path": "uva", "uva_programs": 8, "tpot_ms": 1.0},
        {"concurrency": 32, "path": "host", "uva_programs": None, "host_threads": 12, "tpot_ms": 2.0},
        {"concurrency": 64, "path": "uva", "uva_programs": 16, "tpot_ms": 3.0},
    ],
}


@pytest.mark.parametrize(
    "n, want",
    [
        (1, ("uva", 8)),
        (8, ("uva", 8)),
        (19, ("uva", 8)),
        (21, ("host", None)),
        (32, ("host", None)),
        (47, ("host", None)),
        (49, ("uva", 16)),
        (500, ("uva", 16)),
    ],
)
def test_choose_takes_the_nearest_concurrency(n, want):
    assert tc.choose(n, TABLE) == want


def test_choose_ties_go_to_the_smaller_concurrency():
    assert tc.choose(20, TABLE) == ("uva", 8)  # 12 from 8 and from 32
    assert tc.choose(48, TABLE) == ("host", None)  # 16 from 32 and from 64


def test_explain_carries_host_threads_and_the_reason():
    e = tc.explain(30, TABLE)
    assert e["host_threads"] == 12 and e["entry"]["concurrency"] == 32 and "nearest to 30" in e["reason"]
    assert tc.explain(8, TABLE)["host_threads"] is None


def test_stream_priority_of_an_entry_is_carried_and_checked():
    tab = dict(TABLE, choices=[dict(TABLE["choices"][0], stream_priority="high"), TABLE["choices"][2]])
    assert tc.explain(8, tab)["stream_priority"] == "high" and "high priority" in tc.explain(8, tab)["reason"]
    assert tc.explain(64, tab)["stream_priority"] == "normal"  # absent: normal
    bad = dict(TABLE, choices=[dict(TABLE["choices"][0], stream_priority="urgent")])
    assert tc.explain(8, tab)["copy_graph"] is False  # absent: false (inside the step's graph)
    cg = dict(TABLE, choices=[dict(TABLE["choices"][0], copy_graph=True)])
    assert tc.explain(8, cg)["copy_graph"] is True
    assert (
        "copy_graph must be" in tc.explain(8, dict(TABLE, choices=[dict(TABLE["choices"][0], copy_graph=1)]))["reason"]
    )
    e = tc.explain(8, bad)
    assert e["entry"] is None and e["stream_priority"] == "normal" and "stream_priority must be one of" in e["reason"]


def test_table_from_a_file_and_order_does_not_matter(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(dict(TABLE, choices=TABLE["choices"][::-1])))
    assert tc.choose(20, str(p)) == ("uva", 8)


def test_missing_or_bad_table_falls_back_to_uva_32_with_a_reason(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.warns(RuntimeWarning, match="no usable transfer table.*nope.json.*default uva on 32"):
        assert tc.choose(16, str(missing)) == ("uva", 32)
    e = tc.explain(16, str(missing))
    assert e["entry"] is None and "FileNotFoundError" in e["reason"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"choices": [{"concurrency": 8, "path": "dma"}]}))
    with pytest.warns(RuntimeWarning, match=r"choices\[0\]: path must be one of"):
        assert tc.choose(8, str(bad)) == ("uva", 32)
    with pytest.warns(RuntimeWarning, match="uva_programs"):
        assert tc.choose(8, {"choices": [{"concurrency": 8, "path": "uva"}]}) == ("uva", 32)
    with pytest.warns(RuntimeWarning, match="non-empty 'choices'"):
        assert tc.choose(8, {"choices": []}) == ("uva", 32)


def test_committed_table_parses_and_names_an_existing_results_file():
    tab = tc.load_table()
    files = re.findall(r"experiments/[\w./-]+/results/[\w./-]+\.jsonl?", tab["source"])
    assert files and all(os.path.isfile(os.path.join(REPO, f)) for f in files), tab["source"]
    assert tab["device"] and tab["date"] and tab["commit"]
    for c in tab["choices"]:
        assert c["path"] in ("uva", "host") and isinstance(c["tpot_ms"], float)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the committed table is usable: no fallback warning
        path, progs = tc.choose(16)
    assert path in ("uva", "host")


def _use_table(tmp_path, monkeypatch, table):
    p = tmp_path / "table.json"
    p.write_text(json.dumps(table))
    monkeypatch.setattr(tc, "TABLE", str(p))


def test_prefetcher_auto_takes_the_tables_path_and_explicit_wins(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.runner.runner import Runner

    _use_table(tmp_path, monkeypatch, TABLE)
    kw = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        selection="synthetic",
        top_k=4,
        max_context=128,
        host_kv_gb=0.01,
    )  # no kv_budget_gb: the lanes are max_lanes
    with torch.inference_mode():
        for lanes, path, progs, threads in ((2, "uva", 8, 8), (30, "host", 32, 12), (60, "uva", 16, 8)):
            pipe = Runner(ExecConfig(max_lanes=lanes, **kw)).pipe  # transfer="auto" (the default)
            assert pipe.store.B == lanes
            assert (pipe.route.path, pipe.route.uva_programs, pipe.route.host_threads) == (path, progs, threads), lanes
            assert pipe.route.choice["entry"] is not None
        p = Runner(ExecConfig(max_lanes=30, transfer="uva", uva_programs=4, **kw)).pipe
        assert (p.route.path, p.route.uva_programs, p.route.choice) == ("uva", 4, None)
        p = Runner(ExecConfig(max_lanes=2, transfer="host", host_threads=3, **kw)).pipe
        assert (p.route.path, p.route.host_threads) == ("host", 3)
        from oasis_kernels.host_native import available

        assert p.route.host_kernel == ("native" if available() else "torch")  # auto, no table entry: C where it builds
        p = Runner(ExecConfig(max_lanes=30, mode="retrieval", **{k: v for k, v in kw.items() if k != "mode"})).pipe
        assert p.route.path == "uva"  # retrieval fetches on the critical path: no host-staged version there


def test_stream_priority_auto_takes_the_tables_and_explicit_wins(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.runner.runner import Runner

    tab = dict(TABLE, choices=[dict(TABLE["choices"][0], stream_priority="high"), TABLE["choices"][2]])
    _use_table(tmp_path, monkeypatch, tab)
    kw = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        selection="synthetic",
        top_k=4,
        max_context=128,
        host_kv_gb=0.01,
    )
    with torch.inference_mode():
        assert Runner(ExecConfig(max_lanes=2, **kw)).pipe.route.priority == "high"
        assert Runner(ExecConfig(max_lanes=60, **kw)).pipe.route.priority == "normal"
        assert Runner(ExecConfig(max_lanes=2, stream_priority="normal", **kw)).pipe.route.priority == "normal"
        assert (
            Runner(ExecConfig(max_lanes=60, transfer="uva", stream_priority="high", **kw)).pipe.route.priority == "high"
        )
        assert Runner(ExecConfig(max_lanes=2, transfer="uva", **kw)).pipe.route.priority == "normal"  # no table: normal
    with pytest.raises(ValueError, match="stream_priority"):
        ExecConfig(stream_priority="urgent")
    with pytest.raises(ValueError, match="copy_graph"):
        ExecConfig(copy_graph=True)  # on | off | auto


def test_gather_programs_follow_the_live_batch_under_auto(tmp_path, monkeypatch):
    """auto: the path is fixed for the lane count, the UVA programs follow each step's batch (its uva entries)."""
    torch = pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.runner.runner import Runner

    _use_table(tmp_path, monkeypatch, TABLE)
    kw = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        selection="synthetic",
        top_k=4,
        max_context=128,
        host_kv_gb=0.01,
    )
    with torch.inference_mode():
        pipe = Runner(ExecConfig(max_lanes=60, **kw)).pipe  # 60 lanes: uva on 16
        assert (pipe.route.path, pipe.route.uva_programs) == ("uva", 16)
        # 4 live: the 8-entry (uva8); 30 live: the 32-entry is host, so the lanes' own 16; 64: uva16
        assert [pipe.gather_programs(b) for b in (4, 30, 64)] == [8, 16, 16]
        p = Runner(ExecConfig(max_lanes=60, transfer="uva", uva_programs=4, **kw)).pipe
        assert [p.gather_programs(b) for b in (4, 64)] == [4, 4]  # explicit: what was asked


def test_prefetcher_auto_follows_the_committed_table_and_the_record_names_it():
    pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.tools.bench import run_bench

    rec = run_bench(
        ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode="lookahead",
            selection="synthetic",
            top_k=4,
            max_context=128,
            host_kv_gb=0.01,
            kv_budget_gb=0.05,
            max_lanes=2,
        ),
        64,
        2,
        2,
        1,
    )
    assert (rec["transfer_path"], rec["uva_programs"]) == tc.choose(2)
    assert rec["transfer"] == "auto"


def _rec(label, n, config, ex, role, tpot, **kw):
    r = {
        "label": label,
        "n": n,
        "config": config,
        "exec": ex,
        "role": role,
        "status": "ok",
        "tpot_ms_p50": tpot,
        "throughput_tok_s": 1000.0 * n / tpot,
        "concurrency": n,
        "device": "FAKE GPU",
        "date": "2026-12-01T00:00:00",
        "commit": "fab",
        "context": 16384,
        "fetch_ratio": 0.05,
        "top_k": 128,
        "kv_budget_gb": 52.0,
        "model": "qwen3-8b",
        "steps": 12,
        "warmup": 3,
        "bytes_moved_per_step": 2e8,
    }
    if config.startswith("uva"):
        r["uva_programs"] = int(config.split("-")[0][3:])
    if config.startswith("host"):
        r["host_threads"] = int(config.split("-")[0][4:])
    r.update(kw)
    return r


def test_summarize_arithmetic_on_fabricated_records(tmp_path):
    tp = _script()
    recs = [  # FABRICATED numbers: a unit test of the report's arithmetic
        _rec("c8-notransfer-graph", 8, "notransfer", "graph", "reference", 10.0),
        _rec("c8-uva8-graph", 8, "uva8", "graph", "transfer", 11.0),
        _rec("c8-uva32-graph", 8, "uva32", "graph", "transfer", 12.5),
        _rec("c8-notransfer-eager", 8, "notransfer", "eager", "reference", 50.0),
        _rec("c8-host8-eager", 8, "host8", "eager", "transfer", 50.5),
        _rec(
            "c8-uva8-profile",
            8,
            "uva8",
            "eager",
            "profile",
            60.0,
            stage_ms_per_step={"transfer": 4.0, "stall": 1.0},
            transfer_gb_s=50.0,
            hidden_fraction=0.75,
        ),
        _rec(
            "c8-uva32-profile",
            8,
            "uva32",
            "eager",
            "profile",
            60.0,
            stage_ms_per_step={"transfer": 2.0},
            transfer_gb_s=100.0,
            hidden_fraction=0.9,
        ),
        _rec(
            "c8-host8-profile",
            8,
            "host8",
            "eager",
            "profile",
            70.0,
            stage_ms_per_step={"transfer": 5.0, "host_gather": 30.0},
            transfer_gb_s=40.0,
            hidden_fraction=0.8,
        ),
        _rec("c64-notransfer-graph", 64, "notransfer", "graph", "reference", 30.0),
        _rec("c64-notransfer-eager", 64, "notransfer", "eager", "reference", 100.0),
        _rec("c64-host16-eager", 64, "host16", "eager", "transfer", 99.0),  # faster than its reference: clip to 1
        _rec(
            "c64-host16-profile",
            64,
            "host16",
            "eager",
            "profile",
            120.0,
            stage_ms_per_step={"transfer": 8.0},
            transfer_gb_s=30.0,
        ),
        _rec("c64-uva4-graph", 64, "uva4", "graph", "transfer", 200.0),  # no profiled run: no hidden figure
        _rec("c64-uva4-hi-graph", 64, "uva4-hi", "graph", "transfer", 150.0, uva_programs=4),
        _rec("c64-uva4-hi-ig-graph", 64, "uva4-hi-ig", "graph", "transfer", 160.0, uva_programs=4),
        {"label": "c64-uva8-graph", "n": 64, "status": "error", "error": "RuntimeError: fabricated"},
    ]
    inp = tmp_path / "runs.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs) + "not json\n")
    prefix = tmp_path / "out" / "tp"
    assert tp.main(["--summarize", str(inp), str(prefix)]) == 0
    s = tp.summarize_records(recs)
    rows8 = {r["config"] + "/" + r["exec"]: r for r in s[8]["rows"]}
    assert rows8["uva8/graph"]["exposed_ms"] == pytest.approx(1.0)
    assert rows8["uva8/graph"]["hidden"] == pytest.approx(0.75)  # 1 - 1.0 / 4.0
    assert rows8["uva32/graph"]["hidden"] == pytest.approx(0.0)  # 1 - 2.5 / 2.0 clipped
    assert rows8["host8/eager"]["exposed_ms"] == pytest.approx(0.5)  # against the EAGER reference
    assert rows8["host8/eager"]["hidden"] == pytest.approx(0.9) and rows8["host8/eager"]["cpu_gather_ms"] == 30.0
    assert rows8["uva8/graph"]["gb_s"] == 50.0 and rows8["uva8/graph"]["mb_step"] == pytest.approx(200.0)
    assert s[8]["winner"]["label"] == "c8-uva8-graph"
    rows64 = {r["config"]: r for r in s[64]["rows"] if r["role"] == "transfer"}
    assert rows64["host16"]["hidden"] == 1.0 and rows64["uva4"]["hidden"] is None
    assert (rows64["uva4-hi"]["stream_priority"], rows64["uva4-hi"]["uva_programs"]) == ("high", 4)
    assert rows64["uva4"]["stream_priority"] == "normal" and rows64["uva4"]["copy_graph"]
    assert rows64["uva4-hi-ig"]["stream_priority"] == "high" and rows64["uva4-hi-ig"]["copy_graph"] is False
    assert s[64]["winner"]["label"] == "c64-host16-eager"
    md = (tmp_path / "out" / "tp.md").read_text()
    assert "FAKE GPU" in md and "`fab`" in md and "c64-uva8-graph" in md and "**uva8**" in md and "75%" in md
    table = json.loads((tmp_path / "out" / "tp_table.json").read_text())
    assert table["device"] == "FAKE GPU" and table["commit"] == "fab" and table["date"] == "2026-12-01"
    assert [(c["concurrency"], c["path"], c["uva_programs"], c["host_threads"]) for c in table["choices"]] == [
        (8, "uva", 8, None),
        (64, "host", None, 16),
    ]
    assert table["choices"][1]["no_transfer_tpot_ms"] == 100.0
    assert tc.choose(30, table) == ("uva", 8) and tc.choose(40, table) == ("host", None)
    assert tc.load_table(str(tmp_path / "out" / "tp_table.json"))["choices"]


def test_transfer_paths_cpu_smoke(tmp_path):
    """The script's plumbing on the CPU (the pipeline runs inline there: uva and host do the same work)."""
    pytest.importorskip("torch")
    main = _script().main
    out = tmp_path / "runs.jsonl"
    args = [
        "--out",
        str(out),
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--context",
        "64",
        "--concurrency",
        "2",
        "--programs",
        "4",
        "--threads",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--top-k",
        "2",
    ]
    assert main(args) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    labels = [r["label"] for r in recs]
    assert labels == [
        "c2-notransfer-graph",
        "c2-uva4-graph",
        "c2-notransfer-eager",
        "c2-host2-graph",
        "c2-host2-eager",
        "c2-uva4-profile",
        "c2-host2-profile",
    ]
    assert all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    by = {r["label"]: r for r in recs}
    assert (by["c2-uva4-graph"]["transfer_path"], by["c2-uva4-graph"]["uva_programs"]) == ("uva", 4)
    assert (by["c2-host2-eager"]["transfer_path"], by["c2-host2-eager"]["host_threads"]) == ("host", 2)
    assert by["c2-uva4-profile"]["profile"] and not by["c2-notransfer-eager"]["cuda_graph"]
    assert main(args) == 0 and len(out.read_text().splitlines()) == 7  # rerun: every label done, nothing added
    assert main(["--summarize", str(out), str(tmp_path / "s")]) == 0
    assert json.loads((tmp_path / "s_table.json").read_text())["choices"][0]["concurrency"] == 2


def test_host_kernel_auto_takes_the_tables_and_explicit_wins(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from oasis_exec.config import ExecConfig
    from oasis_exec.runner.runner import Runner

    tab = dict(TABLE, choices=[TABLE["choices"][0], dict(TABLE["choices"][1], host_kernel="native")])
    _use_table(tmp_path, monkeypatch, tab)
    assert tc.explain(30)["host_kernel"] == "native" and tc.explain(2)["host_kernel"] is None
    assert "native gather" in tc.explain(30)["reason"]
    kw = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        selection="synthetic",
        top_k=4,
        max_context=128,
        host_kv_gb=0.01,
    )
    with torch.inference_mode():
        assert Runner(ExecConfig(max_lanes=30, **kw)).pipe.route.host_kernel == "native"
        assert Runner(ExecConfig(max_lanes=30, host_kernel="torch", **kw)).pipe.route.host_kernel == "torch"
    _use_table(tmp_path, monkeypatch, TABLE)  # an entry without the field: the engine's default
    assert tc.explain(30)["host_kernel"] is None
    with pytest.raises(tc.TableError, match="host_kernel"):
        tc.load_table(dict(TABLE, choices=[dict(TABLE["choices"][1], host_kernel="rust")]))
    with pytest.raises(ValueError, match="host_kernel"):
        ExecConfig(host_kernel="rust")


def test_every_stream_priority_has_its_streams():
    """Every configurable priority but auto maps to (step, prediction, copy) CUDA priorities, and a table may name any."""
    from oasis_exec.config import PRIORITIES as CONFIG_PRIORITIES
    from oasis_exec.config import STREAM_PRIORITIES

    assert set(STREAM_PRIORITIES) == set(CONFIG_PRIORITIES) - {"auto"} == set(tc.PRIORITIES)
    assert STREAM_PRIORITIES["normal"] == (0, 0, 0)
    for step, pred, copy in STREAM_PRIORITIES.values():
        assert all(p in (0, -1, -2) for p in (step, pred, copy))


def test_uva_items_per_iter_is_checked_and_reaches_the_gather(monkeypatch):
    """ExecConfig.uva_items_per_iter: a power of two from 1 to 16, passed to oasis_kernels.gather.uva_gather by the UVA
    path (CUDA only runs it; here the kernel's entry is replaced to see its arguments)."""
    import oasis_kernels.gather
    from oasis_exec.config import ExecConfig
    from oasis_exec.transfer.uva import UvaPath

    for bad in (0, 3, 32, True, 2.0):
        with pytest.raises(ValueError, match="uva_items_per_iter"):
            ExecConfig(model="tiny", device="cpu", uva_items_per_iter=bad)
    seen = {}
    monkeypatch.setattr(oasis_kernels.gather, "uva_gather", lambda *a, **kw: seen.update(kw))

    class _Pool:
        k = v = [None]
        quantized = False

    class _Store:
        k = v = [None]

    c = ExecConfig(model="tiny", device="cpu", uva_items_per_iter=8)
    UvaPath(cfg=c, store=_Store(), host=_Pool(), choice=None, programs=4).gather(0, None, None, None, 4)
    assert seen == {"n_programs": 4, "items_per_iter": 8, "scales": None}


def test_uva_items_per_iter_default_keeps_the_bytes_in_flight():
    """Unset, a gather program loads 2 units of a bf16 host copy an iteration and 4 of an fp8 one (half the bytes
    each), so the bytes in flight a program stay 16 KiB; a set value wins."""
    from oasis_exec.config import ExecConfig

    base = dict(model="tiny", device="cpu", mode="lookahead")
    assert ExecConfig(**base).gather_items_per_iter == 2
    assert ExecConfig(**base, host_kv_dtype="fp8_e4m3").gather_items_per_iter == 4
    assert ExecConfig(**base, host_kv_dtype="fp8_e4m3", uva_items_per_iter=2).gather_items_per_iter == 2
    assert ExecConfig(**base, uva_items_per_iter=8).gather_items_per_iter == 8
