"""Kernel-level profile of decode steps: which kernels take a step's time, how many run, GPU-busy vs host wall.

    python experiments/decode_step_profile/step_profile.py --mode dense --context 16384 --concurrency 8 --kv-budget-gb 52 --out FILE.jsonl
    python experiments/decode_step_profile/step_profile.py --mode lookahead --context 16384 --concurrency 16 --kv-budget-gb 52 \\
        --host-kv-gb 40 --no-host-fill --out FILE.jsonl [--no-transfer] [--no-cuda-graph] [--trace-out T.json.gz]
    python experiments/decode_step_profile/step_profile.py --device cpu --model tiny --context 64 --concurrency 2 --top-k 4 \\
        --kv-budget-gb 0.05 --host-kv-gb 0.01 --mode lookahead          # CPU smoke: aten ops per step

The engine is built as ``oasis_exec.tools.bench.run_bench`` builds it (``build_bench_engine``: dummy weights, synthesized
prefill, ``--concurrency`` requests of ``--context`` tokens decoding in lockstep). ``--warmup`` steps run first
(the first decode steps compile kernels and capture the CUDA graph), then ``--plain-steps`` steps timed on the host
without the profiler (the clean wall time), then ``--steps`` steps under ``torch.profiler`` (CPU + CUDA activities).
The profile is exported as a Chrome trace and parsed from its ``traceEvents`` (the route that gives every kernel's
stream, start and duration whatever the torch version's ``FunctionEvent`` API exposes).

During the profiled steps the engine's pieces are wrapped in ``record_function`` ranges (``oasis::qkv``,
``oasis::attn``, ``oasis::prefetch``, ``oasis::sample``, ...; ``--no-annotate`` turns that off), so every host op
and every kernel (through its launch's correlation id) is attributed to a phase of the step. Under CUDA graphs the
layers are one ``cudaGraphLaunch`` (phase ``graph_replay``); the kernels inside a replay are reported by CUPTI
(torch's Kineto) with the launch's correlation id -- seen on the H200 with torch 2.11+cu130: the same kernel count
as the eager step; the record's ``graph_kernels_visible`` says whether they were seen (false: only the launch
showed; profile with ``--no-cuda-graph`` for the kernel split). Inside a replay the kernels run on the driver's
streams for the graph's branches, so the per-stream split (``s_pred`` / ``s_copy`` of ``oasis_exec.workingset.prefetcher``) and
the per-phase GPU times need an eager run. The profiler slows the host (``cudaGraphLaunch`` of a 3-7K-node graph
took 3-8 ms under it, eager ops ~1.5x) but not the kernels: take the host wall from ``wall_ms_plain`` and the GPU
time from ``busy_union_ms`` / ``graph_span_ms``; ``wall_ms_plain - graph_span_ms`` is the step's exposed host work.

One JSON record per invocation is appended to ``--out`` (``RECORD`` below lists the fields) and a short table is
printed. A failure while parsing the profile keeps the wall-clock numbers and sets ``error``.

On the CPU (``--device cpu``; the tests) there are no kernels: the record counts the aten ops of a step (leaf ops:
those that call no other op; ``kernel_like``: leaf ops that are not views or allocations, which approximates the
kernel launches of an eager step), by op name, by category and by phase. On the CPU the attention, block scoring,
summary update and write-back run their torch references (many aten ops each) where CUDA runs one Triton kernel
(``TRITON_LAUNCHES`` says how many), and the decoder runs the plain torch ops (``fused_ops`` off).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from oasis_core import provenance  # noqa: E402

RECORD = (
    "tool",
    "mode",
    "speculative_k",
    "decode_chain",
    "synthetic_accept",
    "context",
    "concurrency",
    "requested_concurrency",
    "max_lanes",
    "kv_budget_gb",
    "host_kv_gb",
    "model",
    "device",
    "device_name",
    "selection",
    "cuda_graph",
    "graph_replay",
    "fused_ops",
    "transfer",
    "transfer_path",
    "uva_programs",
    "no_transfer",
    "top_k",
    "fetch_ratio",
    "warmup",
    "plain_steps",
    "steps",
    "wall_ms_plain",
    "wall_ms_plain_p50",
    "wall_ms",
    "wall_ms_p50",
    "build_s",
    "gpu",
    "host",
    "phases",
    "error",
    "torch",
    "triton",
    "commit",
    "date",
)

# Kernel categories: (name, regex on the kernel name, case-insensitive); the first match wins.
KERNEL_CATEGORIES = (
    ("memcpy/memset", r"^memcpy|^memset|\bmemcpy|\bmemset"),
    ("gemm", r"gemm|gemv|cublas|cutlass|nvjet|xmma|splitkreduce|matmul|cutensor|\bsm\d+_"),
    ("attention", r"paged_attn|sparse_attn|ring_attn|splitk_merge|flash|fmha|attention"),
    ("gather (uva/scatter/writeback)", r"uva_gather|scatter_slots|writeback"),
    ("summary", r"summary_update|summary_moments|token_update"),
    ("score/topk/sort", r"block_score|token_block|token_norm|topk|sort|radix|bitonic|cub::|mbtopk"),
    ("index (torch gather/scatter)", r"index|gather|scatter|embedding"),
    (
        "elementwise/norm/rope",
        r"elementwise|reduce_kernel|norm|rope|silu|swiglu|softmax|catarray|cat_|fill|copy"
        r"|where|arange|cumsum|argmax|argmin|triu|tril|distribution|compare|functor",
    ),
)
_KCAT = [(n, re.compile(p, re.I)) for n, p in KERNEL_CATEGORIES]

# aten op categories (CPU ops, by op name); "view/alloc (no kernel)" ops launch nothing on a GPU.
NO_KERNEL_OPS = {
    "aten::view",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::as_strided",
    "aten::slice",
    "aten::select",
    "aten::transpose",
    "aten::t",
    "aten::permute",
    "aten::expand",
    "aten::expand_as",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::view_as",
    "aten::alias",
    "aten::detach",
    "aten::detach_",
    "aten::split",
    "aten::chunk",
    "aten::unbind",
    "aten::narrow",
    "aten::_unsafe_view",
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::resize_",
    "aten::lift_fresh",
    "aten::result_type",
    "aten::to",
    "aten::contiguous",
    "aten::flatten",
    "aten::unflatten",
    "aten::numpy_T",
    "aten::movedim",
    "aten::broadcast_tensors",
    "aten::split_with_sizes",
    "aten::set_",
    "aten::record_stream",
    "aten::as_strided_",
    "aten::size",
    "aten::stride",
    "aten::dim",
    "aten::is_nonzero_fast",
    "aten::_has_compatible_shallow_copy_type",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::align_tensors",
    "aten::lift",
    "aten::resolve_conj",
    "aten::resolve_neg",
    "aten::broadcast_to",
    "aten::real",
}
# ops that launch nothing on a GPU, with everything below them (CPU scalars and host tensors)
HOST_ONLY_OPS = {"aten::scalar_tensor", "aten::lift_fresh", "aten::result_type"}
# ops that wait for the device on CUDA (a device -> host read)
SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::nonzero_static"}
# ops that are one kernel on CUDA but several aten ops on the CPU (mean = sum + fill_ + div_ there)
ATOMIC_OPS = {"aten::mean"}
OP_CATEGORIES = (
    ("sync (item/nonzero)", r"::(item|_local_scalar_dense|is_nonzero|nonzero|masked_select|tolist|any|all)$"),
    ("gemm", r"::(mm|addmm|bmm|baddbmm|matmul|linear|dot|mv|addmv|einsum)$"),
    (
        "copy/cast",
        r"::(copy_|_to_copy|clone|cat|stack|_copy_from|_copy_from_and_resize|fill_|zero_|full|zeros|ones"
        r"|arange|zeros_like|ones_like|full_like|scalar_tensor|tensor)$",
    ),
    (
        "index/gather/scatter",
        r"::(index|index_put_|_index_put_impl_|index_select|gather|scatter|scatter_|"
        r"scatter_add_|take_along_dim|embedding|index_fill_|masked_fill|masked_fill_|"
        r"repeat_interleave|searchsorted|where)$",
    ),
    (
        "reduce/sort/topk",
        r"::(sum|amax|amin|max|min|mean|argmax|argmin|topk|sort|argsort|cumsum|softmax|_softmax|"
        r"log_softmax|logsumexp|multinomial|unique|count_nonzero|prod)$",
    ),
)
_OCAT = [(n, re.compile(p)) for n, p in OP_CATEGORIES]

# Triton launches on CUDA of what runs as a torch reference on the CPU, per call (sparse_attn: the attention
# kernel, plus the split-K merge when the work is split)
TRITON_LAUNCHES = {
    "attn": "1-2 (sparse_attn / paged_attn + split-K merge)",
    "summary": 1,
    "writeback": 1,
    "predict": "1 block_score + torch top-K (or none: synthetic sets)",
    "transfer": "1 uva_gather",
}

# Phases: the record_function ranges the profiled steps are wrapped in, grouped for the report.
PHASE_GROUP = {
    "qkv": "decoder layer",
    "finish": "decoder layer",
    "logits": "lm head",
    "attn": "attention/KV write",
    "summary": "attention/KV write",
    "writeback": "attention/KV write",
    "layer glue": "attention/KV write",
    "wait": "attention/KV write",
    "prefetch": "prediction+selection+transfer",
    "predict": "prediction+selection+transfer",
    "select": "prediction+selection+transfer",
    "transfer": "prediction+selection+transfer",
    "sample": "sampling/engine",
    "draft": "sampling/engine",
    "synthetic_sets": "sampling/engine",
    "schedule": "sampling/engine",
    "update": "sampling/engine",
    "step prep": "sampling/engine",
    "runner glue": "sampling/engine",
    "engine glue": "sampling/engine",
    "graph_replay": "graph replay",
    "other thread": "other thread",
    "outside step": "outside step",
    "execute": "(container)",
    "decode_core": "(container)",
}
PER_LAYER_PHASES = (
    "qkv",
    "finish",
    "attn",
    "summary",
    "writeback",
    "layer glue",
    "wait",
    "prefetch",
    "predict",
    "select",
    "transfer",
)
SYNC_APIS = re.compile(r"Synchronize|cudaMemcpy$|cuMemcpyDtoH|cuMemcpyHtoD$|cudaStreamQuery", re.I)


def _dims0(e):
    """The first input's dims of an op event (record_shapes), None when unknown."""
    d = (e.get("args") or {}).get("Input Dims")
    return d[0] if isinstance(d, list) and d else None


def kernel_category(name: str) -> str:
    for n, rx in _KCAT:
        if rx.search(name):
            return n
    return "other"


def op_category(name: str) -> str:
    if name in NO_KERNEL_OPS:
        return "view/alloc (no kernel)"
    for n, rx in _OCAT:
        if rx.search(name):
            return n
    return "elementwise/other"


# -- engine ----------------------------------------------------------------------------------------------------


def make_config(a):
    from oasis_exec.config import ExecConfig

    cuda = a.device == "cuda"
    kw = dict(
        model=a.model,
        device=a.device,
        dtype=a.dtype or ("bfloat16" if cuda else "float32"),
        mode=a.mode,
        selection=a.selection,
        top_k=a.top_k,
        block_size=a.block_size,
        fetch_ratio=a.fetch_ratio,
        max_context=a.context
        + (a.warmup + a.plain_steps + a.steps) * max(a.speculative_k + 1, a.decode_chain)
        + 2 * a.block_size,
        kv_budget_gb=a.kv_budget_gb,
        host_kv_gb=a.host_kv_gb if a.mode != "dense" else None,
        max_lanes=a.concurrency if a.max_lanes is None else (a.max_lanes or None),
        transfer=a.transfer,
        uva_programs=a.uva_programs,
        no_transfer=a.no_transfer,
        seed=a.seed,
        cuda_graph=not a.no_cuda_graph,
        synthetic=json.loads(a.synthetic) if a.synthetic else None,
        decode_chain=a.decode_chain,  # decode passes a profiled step (default 1: one graph a step)
        host_kv_dtype=a.host_kv_dtype,
        block_score=a.block_score,
        stream_priority=a.stream_priority,
    )
    if a.speculative_k:  # speculative steps of dummy weights: the accepted drafts drawn (ExecConfig.synthetic_accept)
        kw.update(speculative_k=a.speculative_k, synthetic_accept=json.loads(a.synthetic_accept))
    if a.short_context is not None:
        kw["short_context"] = a.short_context
    if "fused_ops" in ExecConfig.help():
        kw["fused_ops"] = not a.no_fused_ops
    elif a.no_fused_ops:
        print("warning: this ExecConfig has no fused_ops; --no-fused-ops ignored", file=sys.stderr)
    from experiments.common.execargs import exec_fields

    return ExecConfig(**{**kw, **exec_fields(a.exec)})


class Annotator:
    """Wraps the engine's pieces in ``record_function`` ranges named ``oasis::<phase>``; ``remove()`` undoes it."""

    def __init__(self, eng):
        from torch.profiler import record_function

        import oasis_exec.ops as ops_mod
        import oasis_exec.workingset.commit as commit_mod
        import oasis_exec.workingset.resident as resident_mod

        self._rf = record_function
        self._undo = []
        r = eng.runner
        self._wrap(eng.scheduler, "schedule", "schedule")
        self._wrap(eng.scheduler, "update", "update")
        self._wrap(r, "execute", "execute")
        self._wrap(r.model, "decode_core", "decode_core")
        self._wrap(r.cuda_graphs, "replay", "graph_replay")
        self._wrap(r.sources, "_synthetic_sets", "synthetic_sets")
        self._wrap(r.model.selector, "predict", "predict")
        if eng.cfg.chain_max == 1:  # a wrapped sampler is a harness's to the engine, which then runs no chains
            self._wrap(eng, "sampler", "sample")
        self._wrap(r.dec, "qkv", "qkv")
        self._wrap(r.dec, "finish", "finish")
        self._wrap(r.dec, "logits", "logits")
        if r.drafts.head is not None:
            self._wrap(r.drafts.head, "propose", "draft")
        if r.pipe is not None:
            for attr, name in (
                ("launch", "prefetch"),
                ("select", "select"),
                ("wait", "wait"),
                ("_transfer_inline", "transfer"),
                ("fetch_now", "prefetch"),
            ):
                self._wrap(r.pipe, attr, name)
        for attr, name in (("sparse_attn", "attn"), ("paged_attn", "attn"), ("summary_update", "summary")):
            self._wrap(ops_mod, attr, name)
        for mod in (resident_mod, commit_mod):
            self._wrap(mod, "writeback_full", "writeback")

    def _wrap(self, obj, attr, name):
        fn = getattr(obj, attr)
        had = attr in getattr(obj, "__dict__", {})
        rf, label = self._rf, "oasis::" + name

        def wrapped(*args, **kw):
            with rf(label):
                return fn(*args, **kw)

        setattr(obj, attr, wrapped)
        self._undo.append((obj, attr, fn, had))

    def remove(self):
        for obj, attr, fn, had in reversed(self._undo):
            if had:
                setattr(obj, attr, fn)
            else:
                delattr(obj, attr)
        self._undo = []


# -- trace parsing -----------------------------------------------------------------------------------------------


def _nest(events, eps=1e-3):
    """events of one thread (dicts with ts, dur) -> parent index of each (-1: none), by interval containment."""
    order = sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"]))
    parent = [-1] * len(events)
    stack = []
    for i in order:
        e = events[i]
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        while stack:
            p = events[stack[-1]]
            if p["ts"] - eps <= t0 and t1 <= p["ts"] + p["dur"] + eps and t0 < p["ts"] + p["dur"]:
                break
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent


def _union(intervals):
    """Total length of the union of [start, end) intervals."""
    tot, cur0, cur1 = 0.0, None, None
    for a, b in sorted(intervals):
        if cur1 is None or a > cur1:
            if cur1 is not None:
                tot += cur1 - cur0
            cur0, cur1 = a, b
        else:
            cur1 = max(cur1, b)
    if cur1 is not None:
        tot += cur1 - cur0
    return tot


def _clip_union(intervals, lo, hi):
    return _union([(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi])


def parse_trace(events, n_layers, top=40):
    """The step records of a Chrome trace's ``traceEvents`` of ``--steps`` profiled steps (each in an
    ``oasis::step`` range). Returns (gpu dict or None, host dict, phases dict)."""
    steps = sorted(
        (
            e
            for e in events
            if e.get("ph") == "X" and e.get("name") == "oasis::step" and e.get("cat") == "user_annotation"
        ),
        key=lambda e: e["ts"],
    )
    if not steps:
        raise RuntimeError("no oasis::step range in the trace")
    S = len(steps)
    main_tid = steps[0]["tid"]
    bounds = [(s["ts"], s["ts"] + s["dur"]) for s in steps]

    def step_of(ts):
        for i, (a, b) in enumerate(bounds):
            if a <= ts <= b:
                return i
        return None

    # Host side: cpu ops and annotations of every CPU thread, nested.
    by_tid = defaultdict(list)
    for e in events:
        if (
            e.get("ph") == "X"
            and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
            and "dur" in e
        ):
            by_tid[e["tid"]].append(e)
    op_phase = []  # (step, phase, name, is_leaf) per cpu op
    phase_ms = defaultdict(float)  # inclusive host time of each annotated phase (main thread)
    phase_calls = Counter()
    main_windows = []  # (start, end) of each layer on the main thread: qkv start .. finish end
    launch_at = {}  # correlation id -> (step, phase) of the runtime call
    for tid, evs in by_tid.items():
        parent = _nest(evs)
        has_child_op = [False] * len(evs)
        for i, p in enumerate(parent):
            if p >= 0 and evs[i]["cat"] == "cpu_op":
                has_child_op[p] = True
        # kernel-like: not a view/allocation, and no op below it is kernel-like (aten::to -> _to_copy -> copy_
        # counts once, as copy_; aten::index, whose children are views and allocations, counts itself)
        depth = [0] * len(evs)
        for i in sorted(range(len(evs)), key=lambda i: (evs[i]["ts"], -evs[i]["dur"])):
            if parent[i] >= 0:
                depth[i] = depth[parent[i]] + 1
        muted = [False] * len(evs)  # inside a host-only or atomic op: nothing below it launches a kernel
        for i in sorted(range(len(evs)), key=lambda i: depth[i]):
            p = parent[i]
            if p >= 0 and (muted[p] or evs[p]["name"] in HOST_ONLY_OPS or evs[p]["name"] in ATOMIC_OPS):
                muted[i] = True
            elif p >= 0 and evs[p]["cat"] == "cpu_op" and evs[i]["name"] == "aten::to" and _dims0(evs[i]) == []:
                muted[i] = True  # a wrapped Python scalar converted inside an op: a CPU scalar on CUDA too
        below = [False] * len(evs)  # some descendant op is kernel-like
        is_kern = [False] * len(evs)
        for i in sorted(range(len(evs)), key=lambda i: -depth[i]):
            e = evs[i]
            if e["cat"] == "cpu_op":
                is_kern[i] = (
                    not muted[i]
                    and e["name"] not in NO_KERNEL_OPS
                    and e["name"] not in HOST_ONLY_OPS
                    and (not below[i] or e["name"] in ATOMIC_OPS)
                )
            if parent[i] >= 0 and (is_kern[i] or below[i]):
                below[parent[i]] = True
        # layer windows (main thread): from a qkv range's start to the next finish range's end
        for e in evs:
            if e["cat"] == "user_annotation" and e["name"].startswith("oasis::") and e["name"] != "oasis::step":
                s = step_of(e["ts"])
                if s is not None:
                    ph = e["name"][7:]
                    phase_ms[ph] += e["dur"] / 1e3
                    phase_calls[ph] += 1
        windows = main_windows if tid == main_tid else []
        qkv_open = None
        for e in sorted((e for e in evs if e["cat"] == "user_annotation"), key=lambda e: e["ts"]):
            if e["name"] == "oasis::qkv":
                qkv_open = e["ts"]
            elif e["name"] == "oasis::finish" and qkv_open is not None:
                windows.append((qkv_open, e["ts"] + e["dur"]))
                qkv_open = None
        for i, e in enumerate(evs):
            if e["cat"] == "user_annotation":
                continue
            s = step_of(e["ts"])
            if s is None and tid == main_tid:
                continue  # profiler start/stop, sync outside the steps
            if tid != main_tid:
                phase = "other thread"
                if s is None:
                    s = max((j for j, (a, _) in enumerate(bounds) if a <= e["ts"]), default=None)
                    if s is None:
                        continue
            else:
                phase, p, path = None, parent[i], []
                while p >= 0:
                    n = evs[p]["name"]
                    if evs[p]["cat"] == "user_annotation" and n.startswith("oasis::"):
                        path.append(n[7:])
                    p = parent[p]
                phase = _phase_of(path, e["ts"], windows)
            if e["cat"] == "cpu_op":
                op_phase.append((s, phase, e["name"], not has_child_op[i], is_kern[i]))
            else:  # a runtime/driver call: its kernels (same correlation id) belong to this step and phase
                c = (e.get("args") or {}).get("correlation")
                if c is not None:
                    launch_at[c] = (s, phase)

    leaf = [(s, ph, n) for s, ph, n, lf, _ in op_phase if lf]
    kern = [(s, ph, n) for s, ph, n, _, k in op_phase if k]
    per_step = lambda c: round(c / S, 2)  # noqa: E731
    ops_by_name = Counter(n for _, _, n in kern)
    host = {
        "ops_per_step": per_step(len(op_phase)),
        "leaf_ops_per_step": per_step(len(leaf)),
        "kernel_like_ops_per_step": per_step(len(kern)),
        "leaf_ops_by_step": [sum(1 for s, _, _ in leaf if s == i) for i in range(S)],
        "kernel_like_by_step": [sum(1 for s, _, _ in kern if s == i) for i in range(S)],
        # item()/nonzero/boolean-mask indexing: each waits for the device on CUDA (by phase)
        "sync_ops_per_step": {
            ph: per_step(c) for ph, c in Counter(ph for _, ph, n, _, _ in op_phase if n in SYNC_OPS).most_common()
        },
        # kernel-like ops by category and by name
        "op_categories": {c: per_step(v) for c, v in Counter(op_category(n) for _, _, n in kern).most_common()},
        "top_ops": [
            {"name": n, "count_per_step": per_step(c), "category": op_category(n)}
            for n, c in ops_by_name.most_common(top)
        ],
    }
    leaf_ph = Counter(ph for _, ph, _ in leaf)
    kern_ph = Counter(ph for _, ph, _ in kern)
    phases = {}
    for ph in sorted(set(leaf_ph) | set(phase_ms), key=lambda p: -leaf_ph.get(p, 0)):
        d = {
            "group": PHASE_GROUP.get(ph, "other"),
            "leaf_ops_per_step": per_step(leaf_ph.get(ph, 0)),
            "kernel_like_ops_per_step": per_step(kern_ph.get(ph, 0)),
        }
        if ph in phase_ms:
            d["host_ms_per_step"] = round(phase_ms[ph] / S, 4)
            d["calls_per_step"] = per_step(phase_calls[ph])
        top_k_ops = Counter(n for _, p_, n in kern if p_ == ph).most_common(8)
        if top_k_ops:
            d["top_kernel_like_ops"] = {n: per_step(c) for n, c in top_k_ops}
        if ph in PER_LAYER_PHASES:
            d["leaf_ops_per_layer"] = round(leaf_ph.get(ph, 0) / S / n_layers, 2)
            d["kernel_like_ops_per_layer"] = round(kern_ph.get(ph, 0) / S / n_layers, 2)
        phases[ph] = d
    groups = defaultdict(lambda: [0, 0])
    for d in phases.values():
        groups[d["group"]][0] += d["leaf_ops_per_step"]
        groups[d["group"]][1] += d["kernel_like_ops_per_step"]
    host["op_groups"] = {
        g: {"leaf_ops_per_step": round(v[0], 2), "kernel_like_ops_per_step": round(v[1], 2)}
        for g, v in sorted(groups.items(), key=lambda kv: -kv[1][0])
    }

    # Runtime / driver API calls (CUDA) per step, and the host time blocked in syncs.
    rt = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    gpu_ev = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not rt and not gpu_ev:
        return None, host, phases
    corr = {}
    api = defaultdict(lambda: [0, 0.0])
    sync_us = [0.0] * S
    for e in rt:
        s = step_of(e["ts"])
        c = (e.get("args") or {}).get("correlation")
        if c is not None:
            corr[c] = e
        if s is None:
            continue
        api[e["name"]][0] += 1
        api[e["name"]][1] += e["dur"]
        if SYNC_APIS.search(e["name"]):
            sync_us[s] += e["dur"]
    host["runtime_api"] = {
        n: {"count_per_step": per_step(v[0]), "us_per_step": round(v[1] / S, 1)}
        for n, v in sorted(api.items(), key=lambda kv: -kv[1][1])
    }
    host["sync_ms_per_step"] = [round(x / 1e3, 4) for x in sync_us]

    # Kernels: step (and phase) from the launch they correlate with; else from their start time.
    K = []  # (step, name, cat, stream, t0, t1, kind, phase, via_graph)
    graph_corr = {c for c, e in corr.items() if "GraphLaunch" in e["name"]}
    unattributed = 0
    for e in gpu_ev:
        a = e.get("args") or {}
        c = a.get("correlation")
        if c in launch_at:
            s, ph = launch_at[c]
        elif c in corr:  # a launch outside the steps (before the first, after the last)
            s, ph = None, "outside step"
        else:
            s = max((j for j, (b0, _) in enumerate(bounds) if b0 <= e["ts"]), default=None)
            ph = "unknown"
        if s is None:
            unattributed += 1
            continue
        kind = e["cat"]
        name = e["name"]
        K.append(
            (
                s,
                name,
                kernel_category(name) if kind == "kernel" else "memcpy/memset",
                a.get("stream", e.get("tid")),
                e["ts"],
                e["ts"] + e["dur"],
                kind,
                ph,
                c in graph_corr,
            )
        )
    kern_only = [k for k in K if k[6] == "kernel"]
    per = defaultdict(lambda: [0, 0.0])
    for k in kern_only:
        per[k[1]][0] += 1
        per[k[1]][1] += k[5] - k[4]
    tot_kernel_us = sum(v[1] for v in per.values())
    cats = defaultdict(lambda: [0, 0.0])
    for k in K:
        cats[k[2]][0] += 1
        cats[k[2]][1] += k[5] - k[4]
    streams = defaultdict(list)
    for k in K:
        streams[k[3]].append(k)
    stream_out = {}
    for sid, ks in sorted(streams.items(), key=lambda kv: -sum(k[5] - k[4] for k in kv[1])):
        names = Counter()
        for k in ks:
            names[k[1]] += k[5] - k[4]
        label = _stream_label(ks)
        stream_out[str(sid)] = {
            "label": label,
            "count_per_step": per_step(len(ks)),
            "ms_per_step": round(sum(k[5] - k[4] for k in ks) / S / 1e3, 4),
            "busy_ms_per_step": round(
                sum(_union([(k[4], k[5]) for k in ks if k[0] == i]) for i in range(S)) / S / 1e3, 4
            ),
            "top": [n[:120] for n, _ in names.most_common(3)],
        }
    steps_out = []
    for i, (b0, b1) in enumerate(bounds):
        ks = [k for k in K if k[0] == i]
        iv = [(k[4], k[5]) for k in ks]
        all_iv = [(k[4], k[5]) for k in K]
        nxt = bounds[i + 1][0] if i + 1 < S else b1
        d = {
            "host_ms": round((b1 - b0) / 1e3, 4),
            "kernels": sum(1 for k in ks if k[6] == "kernel"),
            "memcpy_memset": sum(1 for k in ks if k[6] != "kernel"),
            "kernel_ms": round(sum(k[5] - k[4] for k in ks if k[6] == "kernel") / 1e3, 4),
            "busy_union_ms": round(_union(iv) / 1e3, 4),
            "span_ms": round((max(b for _, b in iv) - min(a for a, _ in iv)) / 1e3, 4) if iv else 0.0,
            "busy_in_window_ms": round(_clip_union(all_iv, b0, nxt) / 1e3, 4),
            "window_ms": round((nxt - b0) / 1e3, 4),
        }
        if iv:
            d["first_kernel_after_step_start_ms"] = round((min(a for a, _ in iv) - b0) / 1e3, 4)
            d["last_kernel_end_after_step_end_ms"] = round((max(b for _, b in iv) - b1) / 1e3, 4)
        gk = [(k[4], k[5]) for k in ks if k[8]]
        if gk:  # the graph replay inside the step: host work before it starts and after it ends
            d["graph_kernels"] = len(gk)
            d["graph_start_after_step_start_ms"] = round((min(a for a, _ in gk) - b0) / 1e3, 4)
            d["graph_end_before_step_end_ms"] = round((b1 - max(b for _, b in gk)) / 1e3, 4)
            d["graph_span_ms"] = round((max(b for _, b in gk) - min(a for a, _ in gk)) / 1e3, 4)
            d["graph_busy_ms"] = round(_union(gk) / 1e3, 4)
        if i + 1 < S:
            later = [k[4] for k in K if k[0] == i + 1]
            if iv and later:
                d["gap_to_next_step_first_kernel_ms"] = round((min(later) - max(b for _, b in iv)) / 1e3, 4)
        steps_out.append(d)
    ph_gpu = defaultdict(lambda: [0, 0.0])
    for k in K:
        ph_gpu[k[7]][0] += 1
        ph_gpu[k[7]][1] += k[5] - k[4]
    n_graph = sum(1 for k in kern_only if k[8])
    graph_launches = sum(v[0] for n, v in api.items() if "GraphLaunch" in n)

    def mean(key):
        return round(statistics.fmean(d[key] for d in steps_out), 4)

    gpu = {
        "kernels_per_step": mean("kernels"),
        "memcpy_memset_per_step": mean("memcpy_memset"),
        "kernel_ms_per_step": mean("kernel_ms"),
        "busy_union_ms_per_step": mean("busy_union_ms"),
        "span_ms_per_step": mean("span_ms"),
        "busy_in_window_ms_per_step": mean("busy_in_window_ms"),
        "graph_launches_per_step": per_step(graph_launches),
        "graph_kernels_per_step": per_step(n_graph),
        "graph_kernels_visible": (n_graph > 0) if graph_launches else None,
        "unattributed_gpu_events": unattributed,
        "steps": steps_out,
        "categories": {
            c: {"count_per_step": per_step(v[0]), "ms_per_step": round(v[1] / S / 1e3, 4)}
            for c, v in sorted(cats.items(), key=lambda kv: -kv[1][1])
        },
        "streams": stream_out,
        "phases": {
            p: {"count_per_step": per_step(v[0]), "ms_per_step": round(v[1] / S / 1e3, 4)}
            for p, v in sorted(ph_gpu.items(), key=lambda kv: -kv[1][1])
        },
        "top_kernels": [
            {
                "name": n[:200],
                "category": kernel_category(n),
                "count_per_step": per_step(v[0]),
                "us_per_step": round(v[1] / S, 2),
                "mean_us": round(v[1] / v[0], 2),
                "share": round(v[1] / tot_kernel_us, 4) if tot_kernel_us else None,
            }
            for n, v in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
        ],
        "distinct_kernels": len(per),
    }
    return gpu, host, phases


def _stream_label(ks) -> str:
    """What a stream ran: main (GEMMs, attention), pred (block scoring, sorts), copy (the UVA gather). Under CUDA
    graphs the kernels run on the driver's streams for the graph's branches, which mix these."""
    names = " ".join({k[1] for k in ks})
    cats = {k[2] for k in ks}
    parts = [
        lab
        for lab, hit in (
            ("main", "gemm" in cats or "attention" in cats),
            ("pred", "block_score" in names or "radixSort" in names),
            ("copy", "uva_gather" in names),
        )
        if hit
    ]
    return "+".join(parts) or "other"


def _phase_of(path, ts, windows):
    """The phase of an op from its enclosing oasis:: ranges (innermost first)."""
    for n in path:
        if n in ("execute", "decode_core", "graph_replay"):
            break
        return n
    if not path:
        return "engine glue"
    if path[0] == "graph_replay":
        return "graph_replay"
    if path[0] == "decode_core":
        return "layer glue" if any(a <= ts <= b for a, b in windows) else "step prep"
    return "runner glue"


# -- the run -----------------------------------------------------------------------------------------------------


def profile_steps(a) -> dict:
    import torch

    import oasis_kernels  # noqa: F401  (TRITON_INTERPRET without CUDA, before triton)
    from oasis_exec.tools.bench import build_bench_engine

    if a.cpu_threads:
        torch.set_num_threads(a.cpu_threads)
    cfg = make_config(a)
    cuda = a.device == "cuda"
    rec = {
        "tool": "step_profile",
        "mode": a.mode,
        "speculative_k": a.speculative_k,
        "decode_chain": cfg.chain_max,  # decode passes an engine step at most (ExecConfig.chain_max)
        "synthetic_accept": json.loads(a.synthetic_accept) if a.speculative_k else None,
        "context": a.context,
        "requested_concurrency": a.concurrency,
        "kv_budget_gb": a.kv_budget_gb,
        "host_kv_gb": cfg.host_kv_gb,
        "model": a.model,
        "device": a.device,
        "selection": a.selection,
        "cuda_graph": cfg.cuda_graph,
        "fused_ops": getattr(cfg, "fused_ops", None),
        "transfer": cfg.transfer if cfg.sparse else None,
        "uva_programs": cfg.uva_programs if cfg.sparse else None,
        "no_transfer": cfg.no_transfer,
        "host_kv_dtype": cfg.host_kv_dtype,
        "block_score": cfg.block_score,
        "top_k": cfg.top_k,
        "fetch_ratio": cfg.fetch_ratio,
        "warmup": a.warmup,
        "plain_steps": a.plain_steps,
        "steps": a.steps,
        "torch": torch.__version__,
        "commit": provenance.commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import triton

        rec["triton"] = triton.__version__
    except Exception:
        rec["triton"] = None
    rec["device_name"] = torch.cuda.get_device_name() if cuda else (platform.processor() or "cpu")
    t0 = time.perf_counter()
    try:
        eng, n = build_bench_engine(
            cfg, a.context, a.concurrency, a.plain_steps + a.steps, a.warmup, not a.no_host_fill
        )
    except Exception as e:
        rec["error"] = f"build: {type(e).__name__}: {e} | " + traceback.format_exc(limit=4)[-800:]
        return rec
    rec["build_s"] = round(time.perf_counter() - t0, 2)
    rec["concurrency"], rec["max_lanes"] = n, eng.max_lanes
    runner = eng.runner
    pipe = runner.pipe
    if pipe is not None:  # what transfer="auto" resolved to (oasis_exec.transfer.choice, where it exists)
        rec["transfer_path"] = pipe.route.path
        rec["uva_programs"] = getattr(pipe, "uva_programs", cfg.uva_programs) if pipe.route.path == "uva" else None

    def sync():
        if cuda:
            torch.cuda.synchronize()

    try:
        for _ in range(a.warmup):
            eng.step()
        sync()
        plain = []
        for _ in range(a.plain_steps):
            t = time.perf_counter()
            eng.step()
            plain.append(1e3 * (time.perf_counter() - t))
        rec["wall_ms_plain"] = [round(x, 4) for x in plain]
        rec["wall_ms_plain_p50"] = round(statistics.median(plain), 4) if plain else None
        rec["graph_replay"] = bool(runner.cuda_graphs.graphs)
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        ann = Annotator(eng) if not a.no_annotate else None
        walls = []
        sync()
        try:
            with profile(activities=acts, record_shapes=True) as prof:
                for _ in range(a.steps):
                    t = time.perf_counter()
                    with record_function("oasis::step"):
                        eng.step()
                    walls.append(1e3 * (time.perf_counter() - t))
                sync()
        finally:
            if ann is not None:
                ann.remove()
        rec["wall_ms"] = [round(x, 4) for x in walls]
        rec["wall_ms_p50"] = round(statistics.median(walls), 4) if walls else None
        try:
            fd, path = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            prof.export_chrome_trace(path)
            if a.trace_out:
                d = os.path.dirname(a.trace_out)
                if d:
                    os.makedirs(d, exist_ok=True)
                if a.trace_out.endswith(".gz"):
                    with open(path, "rb") as src, gzip.open(a.trace_out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                else:
                    shutil.copyfile(path, a.trace_out)
            with open(path) as fh:
                events = json.load(fh)["traceEvents"]
            os.unlink(path)
            gpu, host, phases = parse_trace(events, runner.L, a.top)
            rec["gpu"], rec["host"], rec["phases"] = gpu, host, phases
        except Exception as e:  # keep the wall-clock numbers
            rec["error"] = f"profile parse: {type(e).__name__}: {e} | " + traceback.format_exc(limit=3)[-600:]
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e} | " + traceback.format_exc(limit=4)[-800:]
    finally:
        try:
            eng.close()
        except Exception:
            pass
    rec["n_layers"] = runner.L
    return rec


def print_table(rec, out=None) -> None:
    out = out or sys.stdout
    p = lambda *x: print(*x, file=out)  # noqa: E731
    p(
        f"== {rec.get('mode', rec.get('from_trace'))} ctx={rec.get('context')} n={rec.get('concurrency')} "
        f"graph={rec.get('graph_replay')} "
        f"fused={rec.get('fused_ops')} transfer={rec.get('transfer_path')} no_transfer={rec.get('no_transfer')} "
        f"device={rec.get('device_name')}"
    )
    p(f"host wall ms/step: plain p50 {rec.get('wall_ms_plain_p50')}  profiled p50 {rec.get('wall_ms_p50')}")
    if rec.get("error"):
        p("ERROR:", rec["error"])
    g = rec.get("gpu")
    if g:
        p(
            f"GPU: {g['kernels_per_step']} oasis_kernels/step (+{g['memcpy_memset_per_step']} memcpy/memset), "
            f"kernel {g['kernel_ms_per_step']} ms, busy(union) {g['busy_union_ms_per_step']} ms, span "
            f"{g['span_ms_per_step']} ms, busy in step window {g['busy_in_window_ms_per_step']} ms; graph launches "
            f"{g['graph_launches_per_step']}/step, graph kernels visible: {g['graph_kernels_visible']}"
        )
        p(f"{'category':34s} {'n/step':>8s} {'ms/step':>9s}")
        for c, v in g["categories"].items():
            p(f"{c:34s} {v['count_per_step']:8.1f} {v['ms_per_step']:9.3f}")
        p(f"{'stream':10s} {'label':16s} {'n/step':>8s} {'ms/step':>9s} {'busy':>9s}  top")
        for sid, v in g["streams"].items():
            p(
                f"{sid:10s} {v['label']:16s} {v['count_per_step']:8.1f} {v['ms_per_step']:9.3f} "
                f"{v['busy_ms_per_step']:9.3f}  {v['top'][0][:60] if v['top'] else ''}"
            )
        p(f"{'kernel':70s} {'n/step':>7s} {'us/step':>9s} {'mean':>8s} {'share':>6s}")
        for k in g["top_kernels"][:15]:
            p(
                f"{k['name'][:70]:70s} {k['count_per_step']:7.1f} {k['us_per_step']:9.1f} {k['mean_us']:8.2f} "
                f"{k['share'] or 0:6.3f}"
            )
    h = rec.get("host")
    if h:
        p(
            f"host: {h['ops_per_step']} aten ops/step, {h['leaf_ops_per_step']} leaf, {h['kernel_like_ops_per_step']}"
            f" kernel-like; sync ms/step {h.get('sync_ms_per_step')}"
        )
        p(f"{'op group':32s} {'leaf/step':>10s} {'kern/step':>10s}")
        for gname, v in h["op_groups"].items():
            p(f"{gname:32s} {v['leaf_ops_per_step']:10.1f} {v['kernel_like_ops_per_step']:10.1f}")
    ph = rec.get("phases")
    if ph:
        p(f"{'phase':16s} {'group':30s} {'leaf/step':>9s} {'kern/step':>9s} {'kern/layer':>10s} {'host ms':>8s}")
        for name, v in ph.items():
            p(
                f"{name:16s} {v['group']:30s} {v['leaf_ops_per_step']:9.1f} {v['kernel_like_ops_per_step']:9.1f} "
                f"{v.get('kernel_like_ops_per_layer', ''):>10} {v.get('host_ms_per_step', ''):>8}"
            )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="step_profile",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    ap.add_argument("--mode", default="lookahead", help="dense | quest | retrieval | proxy | lookahead")
    ap.add_argument("--context", type=int, default=16384, help="prompt tokens per request (synthesized prefill)")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="requests decoding in lockstep (bounded by lanes and host blocks, as the bench does)",
    )
    ap.add_argument("--kv-budget-gb", type=float, default=None, help="GPU memory for KV state, GB")
    ap.add_argument("--host-kv-gb", type=float, default=None, help="pinned host pool, GB (sparse modes)")
    ap.add_argument(
        "--max-lanes",
        type=int,
        default=None,
        help="cap on lanes (default: --concurrency, as the "
        "h200_* and record_matrix scripts set it; 0: what "
        "the KV budget fits, as the bench CLI does)",
    )
    ap.add_argument("--model", default="qwen3-8b", help="oasis_core model preset (dummy weights)")
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--selection", default="synthetic", help="model | synthetic")
    ap.add_argument("--top-k", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--fetch-ratio", type=float, default=0.05)
    ap.add_argument("--transfer", default="auto", help="host | uva | auto (uva)")
    ap.add_argument("--uva-programs", type=int, default=32)
    ap.add_argument("--no-transfer", action="store_true", help="plan selections, skip the copies")
    ap.add_argument(
        "--stream-priority",
        default="auto",
        help="ExecConfig.stream_priority: normal | high | low | pred_low | pred_low_copy_high | auto",
    )
    ap.add_argument(
        "--decode-chain",
        type=int,
        default=1,
        help="ExecConfig.decode_chain: decode passes an engine step (a profiled step then holds that many graph "
        "launches; critical_path.py measures the gaps between them)",
    )
    ap.add_argument("--host-kv-dtype", default="auto", help="auto (the compute dtype) | fp8_e4m3 (ExecConfig's)")
    ap.add_argument("--block-score", default="minmax", help="ExecConfig.block_score (oasis_core.block_scorers)")
    ap.add_argument("--no-cuda-graph", action="store_true", help="eager decode steps (every kernel launched)")
    ap.add_argument("--no-fused-ops", action="store_true", help="plain torch norm/RoPE/SwiGLU (ExecConfig.fused_ops)")
    ap.add_argument(
        "--short-context",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ExecConfig.short_context (sparse modes; default: ExecConfig's, on): short requests run resident-dense",
    )
    ap.add_argument("--no-host-fill", action="store_true", help="leave the pinned host pool unwritten (faster build)")
    ap.add_argument("--synthetic", default=None, help="JSON of SyntheticParams overrides")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="steps before anything is timed (>= 3 under graphs: the first step runs eagerly, the second captures)",
    )
    ap.add_argument(
        "--speculative-k",
        type=int,
        default=0,
        help="speculative steps of k drafts, their accepted drafts drawn from --synthetic-accept",
    )
    ap.add_argument(
        "--synthetic-accept",
        default='{"alpha": 0.5}',
        help="JSON acceptance the speculative steps' accepted drafts are drawn from (dummy weights)",
    )
    ap.add_argument(
        "--exec",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other ExecConfig field (repeatable; overrides the options above), e.g. synthetic_ahead=64",
    )
    ap.add_argument("--plain-steps", type=int, default=5, help="steps timed on the host without the profiler")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--top", type=int, default=40, help="kernels / ops listed")
    ap.add_argument("--no-annotate", action="store_true", help="no record_function ranges (no phases)")
    ap.add_argument("--cpu-threads", type=int, default=None, help="torch.set_num_threads (CPU runs)")
    ap.add_argument("--trace-out", default=None, help="also keep the Chrome trace here (.json or .json.gz)")
    ap.add_argument("--out", default=None, help="append the JSON record to this .jsonl")
    ap.add_argument("--quiet", action="store_true", help="no table on stdout")
    ap.add_argument(
        "--from-trace",
        default=None,
        metavar="TRACE",
        help="re-analyse a trace saved by --trace-out (no engine; give --n-layers)",
    )
    ap.add_argument("--n-layers", type=int, default=36, help="decoder layers of the traced model (--from-trace)")
    return ap


def _write(rec: dict, path) -> None:
    if path:
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


def load_trace_events(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.from_trace:  # re-analyse a saved trace (--trace-out of an earlier run): no engine, no device
        rec = {"tool": "step_profile", "from_trace": a.from_trace, "n_layers": a.n_layers}
        try:
            rec["gpu"], rec["host"], rec["phases"] = parse_trace(load_trace_events(a.from_trace), a.n_layers, a.top)
        except Exception as e:
            rec["error"] = f"profile parse: {type(e).__name__}: {e} | " + traceback.format_exc(limit=3)[-600:]
        _write(rec, a.out)
        if not a.quiet:
            print_table(rec)
        return 1 if rec.get("error") else 0
    if a.steps < 1:
        raise SystemExit("--steps must be >= 1")
    if a.device == "cuda" and not a.no_cuda_graph and a.warmup < 3:
        print("warning: --warmup < 3 with CUDA graphs: profiled steps may include the capture", file=sys.stderr)
    rec = profile_steps(a)
    _write(rec, a.out)
    if not a.quiet:
        print_table(rec)
    return 1 if rec.get("error") and "wall_ms" not in rec else 0


if __name__ == "__main__":
    sys.exit(main())
