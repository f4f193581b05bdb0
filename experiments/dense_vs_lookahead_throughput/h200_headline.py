"""The H200 sweep: dense against lookahead at one KV budget (52 GB), per context, in one process.

    python experiments/dense_vs_lookahead_throughput/h200_headline.py --out FILE.jsonl [--budget-s 480] [--fused-ab] [--dry-run]
    python experiments/dense_vs_lookahead_throughput/h200_headline.py --out /tmp/s.jsonl --device cpu --model tiny --contexts 64 --dense-n 2,max \\
        --la-n 1,2 --max-n 4,3 --nt-n 2 --sens-n all --anchors 2          # CPU smoke (seconds)
    python experiments/dense_vs_lookahead_throughput/h200_headline.py --preset first-headline ...     # the 2026-11-30 headline plan (run 5)
    python experiments/dense_vs_lookahead_throughput/h200_headline.py --preset first-sensitivity ...  # the 2026-11-30 sensitivity plan (run 6)

Every run is ``oasis_exec.tools.bench.run_bench`` (dummy weights, synthetic selection, top-K 128, block 16, the
engine's own transfer choice ``--transfer auto``: the measured table's path and programs for the run's concurrency;
until 2026-12-02 the default was ``uva``, which runs 32 programs whatever the table says; whole-step CUDA graphs,
host pool not filled; ``--synthetic-work model``: the synthetic sets of every pass drawn before the timed steps and
the model selection's top-K run in each layer, the GPU work of a model-selected step, where until 2026-12-02 the
generator ran beside each step and no top-K ran, ``--synthetic-work live``). The default plan (``--preset headline``), for each context of
``--contexts`` (default 16384,32768), at the ``--kv-budget-gb`` budget (52 GB, what an 80 GB H100 leaves):

- ``dense`` at ``--dense-n`` (16K: 8,12,16,max; 32K: 4,8,max; ``max`` = the engine's lanes for mode=dense at the
  budget, ``int(budget // DenseStore.bytes_per_lane)``: 21 at 16K, 10 at 32K);
- the whole-H200 dense anchors (dense given the whole GPU) at ``--anchors`` (16K: 8,32; 32K: 8) with ``--anchor-kv-gb`` 120;
- ``lookahead`` at ``--la-n`` (16K: 8,16,32,48,64,80; 32K: 8,16,24,32,40) and at the largest of the ``--max-n``
  candidates that host memory allows (16K: 88,84; 32K: 44,42; tried in order, the first that runs wins);
- ``--no-transfer`` twins (the overlap reference) at ``--nt-n`` (16K: 16,64);
- the sensitivity variants ``--variants`` (drift x2 and x4 of the synthetic default, fetch ratios 0.02 and 0.10)
  at ``--sens-n`` (16K only: ``all`` = every lookahead concurrency of the context's sweep, host maximum included);
- with ``--fused-ab``, ``fused_ops=False`` twins of dense-8 and lookahead-16 at the first context.

Order: dense runs first (no host pool), then every lookahead run largest host pool first across contexts (a 16K pool
of 88 requests holds a 32K pool of 44, so the pool is pinned once in the process and every later pool reuses its
registered pieces, ``oasis_exec.kv.store.pinned_pieces``), each ``--no-transfer`` / unfused twin right after its
base run, then the sensitivity variants, largest pool first. Host-memory guard: before a lookahead run that has to
pin a new pool, ``/proc/meminfo`` MemAvailable (plus the kept pool it would free) minus the new pool must leave
``--min-free-gb`` (12), else the run is written as ``status: skipped`` with the reason. Budget: a run whose estimate
would end past ``--budget-s`` (seconds since start) is written as skipped (``reason: budget``). One JSON line per
run: the bench record plus ``label``, ``kind``, ``variant``, ``group``, ``status`` and the host memory before it; a
``status: started`` line precedes every run, so a run that killed the process is recorded as an error on the next
invocation. Labels already in ``--out`` with a result (``ok`` or ``error``) are not run again: a second invocation
resumes. Errors are recorded and the loop goes on, except an error that leaves the CUDA context unusable (illegal
address, device-side assert): then the process exits with rc 3 and the next invocation resumes in a fresh one.
``--dry-run`` prints the plan with time estimates.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from experiments.common.execargs import exec_fields  # noqa: E402

BS = 16
TOP_K = 128
BASE_FETCH = 0.05
HBM_READ_B_S = 4.3e12  # measured attention read rate of the H200 (oasis_core.specs, h200)
FIRST_RUN_S = 20.0  # estimate: CUDA context, Triton JIT of the dense kernels
FIRST_SPARSE_S = 15.0  # estimate: JIT of the sparse kernels
# errors after which every later kernel launch of the process fails: stop, a new invocation resumes after the label
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "CUDA error: unknown error",
)

PRESETS = {
    # dense vs lookahead at 52 GB to each mode's maximum, overlap, sensitivity, on a 256 GiB host; plan arguments per context (other contexts: the "*" entry)
    "headline": dict(
        contexts="16384,32768",
        budget_s=480.0,
        steps=24,
        warmup=4,
        dense_n={16384: "8,12,16,max", 32768: "4,8,max", "*": "max"},
        la_n={16384: "8,16,32,48,64,80", 32768: "8,16,24,32,40", "*": "8,16"},
        max_n={16384: "88,84", 32768: "44,42", "*": ""},
        nt_n={16384: "16,64", "*": ""},
        sens_n={16384: "all", "*": ""},
        anchors={16384: "8,32", 32768: "8", "*": ""},
        variants="drift2,drift4,fr0.02,fr0.1",
        probe_n="0",
    ),
    # issue 16's cost points: each fetch-cap policy at one lookahead concurrency per context (the same host pool:
    # 32 x 16K = 16 x 32K), dense at its budget maximum, the no-transfer twin at 16K; use with --synthetic
    "policies": dict(
        contexts="16384,32768",
        budget_s=480.0,
        steps=24,
        warmup=4,
        dense_n={"*": "max"},
        la_n={16384: "32", 32768: "16", "*": "8"},
        max_n={"*": ""},
        nt_n={16384: "32", "*": ""},
        sens_n={"*": "all"},
        anchors={"*": ""},
        variants="pol=unlimited,pol=drift,pol=per-layer:0.05,pol=recall:0.9,pol=budget:0.5",
        probe_n="0",
    ),
    # the 2026-11-30 headline (run 5, results/headline_first.jsonl): old labels, one context
    "first-headline": dict(
        contexts="16384",
        budget_s=150.0,
        steps=12,
        warmup=3,
        dense_n={"*": "21"},
        la_n={"*": "32,16"},
        max_n={"*": "40,36"},
        nt_n={"*": ""},
        sens_n={"*": ""},
        anchors={"*": ""},
        variants="none",
        probe_n="44",
    ),
    # the 2026-11-30 sensitivity (run 6, results/sensitivity_first.jsonl): old labels, one context
    "first-sensitivity": dict(
        contexts="16384",
        budget_s=90.0,
        steps=16,
        warmup=4,
        dense_n={"*": "21"},
        la_n={"*": "32,16"},
        max_n={"*": ""},
        nt_n={"*": ""},
        sens_n={"*": ""},
        anchors={"*": ""},
        variants="drift2,drift4,fr0.02,fr0.1",
        probe_n="0",
    ),
}


@dataclass
class Run:
    label: str
    ctx: int
    mode: str  # dense | lookahead
    n: int
    kind: str  # dense | anchor | la | max | nt | sens | fused | probe
    variant: str = "base"  # base | notransfer | unfused | drift2 | drift4 | fr0.02 | fr0.1 | ...
    kv_budget_gb: float = 52.0
    fetch_ratio: float = BASE_FETCH
    synthetic: dict | None = None
    extra: dict = field(default_factory=dict)  # other ExecConfig fields: no_transfer, fused_ops
    group: str = ""  # alternatives: once a member ran ok, the others are not run
    needs: str = ""  # a label that must have run ok first
    repeat: int = 1  # --repeat: which pass over the plan (labels of passes 2.. end -rK)

    @property
    def sparse(self) -> bool:
        return self.mode != "dense"


# -- sizes ---------------------------------------------------------------------------------------------------------


class Geometry:
    """The byte sizes the plan needs, from oasis_core.specs and the executor's own per-lane formulas."""

    def __init__(
        self, model: str, device: str, steps: int, warmup: int, step_tokens: int = 1, host_kv_dtype: str = "auto"
    ):
        from oasis_core.geometry import KVGeometry
        from oasis_core.specs import get_model

        self.m = get_model(model)
        self.eb = 2 if device == "cuda" else 4  # bfloat16 on CUDA, float32 on the CPU (as the runner)
        # output tokens a request a step at most (a decode chain's length): the bench's requests are that much longer
        self.steps, self.warmup = steps * step_tokens, warmup * step_tokens
        # one host block: all layers, K and V, as the host copy holds them (fp8: a byte an element plus the scales)
        self.unit = KVGeometry(self.m, BS, self.eb).host_bytes_per_block(host_kv_dtype)

    def max_context(self, ctx: int) -> int:
        return ctx + self.warmup + self.steps + 2 * BS

    def host_gb(self, n: int, ctx: int) -> float:
        """The pool run_bench needs for ``n`` requests (one spare block each, +10 MB), as ExecConfig.host_kv_gb."""
        blocks = -(-(ctx + self.steps + self.warmup) // BS)
        return round(n * (blocks + 1) * self.unit / 1e9 + 0.01, 3)

    def pool_bytes(self, host_gb: float) -> int:
        """Bytes the runner pins for ``host_gb`` (whole host blocks: Runner's ``host_kv_gb * 1e9 // unit``)."""
        return int(host_gb * 1e9 // self.unit) * self.unit

    def per_request_gb(self, ctx: int) -> float:
        return (-(-(ctx + self.steps + self.warmup) // BS) + 1) * self.unit / 1e9

    def lanes(self, mode: str, ctx: int, budget_gb: float, slots: int = TOP_K) -> int:
        """The engine's lane count at ``budget_gb`` (Runner: ``int(budget // bytes_per_lane)``), sparse rows of
        ``slots`` GPU blocks."""
        from oasis_core.geometry import KVGeometry
        from oasis_exec.kv.store import DenseStore, SparseStore

        m, nb = self.m, -(-self.max_context(ctx) // BS)
        if mode == "dense":
            per = DenseStore.bytes_per_lane(KVGeometry(m, BS, self.eb), nb, False)
        else:
            per = SparseStore.bytes_per_lane(KVGeometry(m, BS, self.eb), slots, nb)
        return int(budget_gb * 1e9 // per)

    def tpot_guess_s(self, run: Run) -> float:
        """A rough step time for the time estimate (dense: 1.4 x the HBM roofline + 2 ms, as measured on 2026-11-30;
        lookahead: 16 ms + 0.2 ms a request at 16K)."""
        if not run.sparse:
            return 1.4 * (self.m.weight_bytes + run.n * run.ctx * self.m.kv_bytes_per_token) / HBM_READ_B_S + 0.002
        return 0.016 + 0.0002 * run.n * math.sqrt(run.ctx / 16384)


def meminfo() -> dict:
    """MemTotal and MemAvailable of /proc/meminfo in GB (1e9 bytes); {} where it cannot be read."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("MemTotal", "MemAvailable"):
                    out[k] = int(v.split()[0]) * 1024 / 1e9
    except (OSError, ValueError):
        return {}
    return out


def pinned_kept() -> tuple:
    """(pieces, bytes per piece) that oasis_exec.kv.store keeps registered for reuse (0, 0 if none / no CUDA)."""
    try:
        from oasis_exec.kv import store as kv_store

        kept = getattr(kv_store, "_PINNED", {"pieces": [], "piece_bytes": 0})
        return len(kept["pieces"]), int(kept["piece_bytes"])
    except Exception:
        return 0, 0


# -- plan ------------------------------------------------------------------------------------------------------------


def parse_ctx(s) -> int:
    s = str(s).strip().lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


def ctx_tag(ctx: int) -> str:
    return f"{ctx // 1024}k" if ctx % 1024 == 0 else f"c{ctx}"


def parse_spec(values, default: dict) -> dict:
    """Per-context lists: ``"8,16"`` (every context) or ``"16k=8,16;32768=4"``; a flag may repeat. -> {ctx|'*': str}."""
    if not values:
        return dict(default)
    out = {"*": ""}
    for v in values:
        for part in str(v).split(";"):
            part = part.strip()
            if "=" in part:
                k, lst = part.split("=", 1)
                out[parse_ctx(k)] = lst.strip()
            else:
                out["*"] = part
    return out


def spec_for(spec: dict, ctx: int) -> list:
    """Tokens of a spec at ``ctx``: ints, ``max`` or ``all``; ``none`` or empty -> []."""
    raw = spec.get(ctx, spec.get("*", ""))
    toks = [t.strip() for t in str(raw).split(",") if t.strip() and t.strip().lower() != "none"]
    out = [t.lower() if t.lower() in ("max", "all") else int(t) for t in toks]
    return [t for t in out if not isinstance(t, int) or t > 0]


def variant_params(name: str, drift0: float, zone0: float) -> tuple:
    """(fetch ratio, SyntheticParams overrides, other ExecConfig fields) of a variant: ``driftK`` = K x the default
    drift_rate (drift_zone raised to it when it would exceed the default zone: drift happens only inside the zone),
    ``frX`` = fetch ratio X, ``pol=SPEC`` = the fetch-cap policy SPEC (``oasis_core.fetchcap.get_policy``; write its
    commas as ``+``, since variants are comma-separated: ``pol=budget:0.5+max_ratio=0.05``), ``mode=MODE`` = another
    sparse mode at the same point and selections (e.g. ``mode=hisparse``, the HiSparse-style baseline)."""
    if name.startswith("drift"):
        rate = round(float(name[5:]) * drift0, 6)
        syn = {"drift_rate": rate}
        if rate > zone0:
            syn["drift_zone"] = rate
        return BASE_FETCH, syn, {}
    if name.startswith("fr"):
        return float(name[2:]), None, {}
    if name.startswith("pol="):
        from oasis_core.fetchcap import get_policy

        spec = name[4:].replace("+", ",")
        get_policy(spec)  # a bad spec fails at planning, not mid-run
        return BASE_FETCH, None, {"fetch_policy": spec}
    if name.startswith("mode="):
        from oasis_core import modes

        modes.get(name[5:])  # a bad mode fails at planning
        return BASE_FETCH, None, {"mode": name[5:]}
    if name.startswith("set="):
        return BASE_FETCH, None, exec_fields(name[4:].replace(":", "=").split("+"))
    raise ValueError(f"unknown variant {name!r} (driftK, frX, pol=SPEC, mode=MODE or set=FIELD:VALUE)")


def variant_run(v: str, prefix: str, ctx: int, n: int, budget_gb: float, drift0: float, zone0: float, needs="") -> Run:
    """The sensitivity run of variant ``v`` at ``n`` requests: ``{prefix}lookahead-{n}-{v}``, or ``{prefix}{mode}-{n}``
    for a ``mode=MODE`` variant (``variant_params``)."""
    fr, syn, extra = variant_params(v, drift0, zone0)
    mode = extra.pop("mode", "lookahead")
    label = f"{prefix}lookahead-{n}-{v}" if mode == "lookahead" else f"{prefix}{mode}-{n}"
    return Run(
        label, ctx, mode, n, "sens", v, kv_budget_gb=budget_gb, fetch_ratio=fr, synthetic=syn, extra=extra, needs=needs
    )


def _synthetic_defaults() -> tuple:
    from oasis_core.synthetic import SyntheticParams

    p = SyntheticParams()
    return p.drift_rate, p.drift_zone


def plan_headline(a, geo: Geometry) -> list:
    d0, z0 = _synthetic_defaults()
    variants = [v for v in a.variants.split(",") if v and v != "none"]
    dense, sparse, sens = [], [], []
    for ci, ctx in enumerate(a.contexts):
        tag, B = ctx_tag(ctx), a.kv_budget_gb
        dmax = geo.lanes("dense", ctx, B)
        dn = sorted({dmax if t == "max" else t for t in spec_for(a.dense_n, ctx)})
        fused = a.fused_ab and ci == 0
        if fused and 8 not in dn:
            dn = sorted(dn + [8])
        for n in dn:
            dense.append(Run(f"{tag}-dense-{n}", ctx, "dense", n, "dense", kv_budget_gb=B))
            if fused and n == 8:
                dense.append(
                    Run(
                        f"{tag}-dense-{n}-unfused",
                        ctx,
                        "dense",
                        n,
                        "fused",
                        "unfused",
                        kv_budget_gb=B,
                        extra={"fused_ops": False},
                    )
                )
        for n in spec_for(a.anchors, ctx):
            dense.append(Run(f"{tag}-dense-{n}-h200", ctx, "dense", n, "anchor", kv_budget_gb=a.anchor_kv_gb))
        la = [t for t in spec_for(a.la_n, ctx) if isinstance(t, int)]
        cands = [t for t in spec_for(a.max_n, ctx) if isinstance(t, int) and t not in la]
        for n in la:
            sparse.append(Run(f"{tag}-lookahead-{n}", ctx, "lookahead", n, "la", kv_budget_gb=B))
        for n in cands:
            sparse.append(Run(f"{tag}-lookahead-{n}", ctx, "lookahead", n, "max", kv_budget_gb=B, group=f"{tag}-max"))
        for n in spec_for(a.nt_n, ctx):
            sparse.append(
                Run(
                    f"{tag}-lookahead-{n}-notransfer",
                    ctx,
                    "lookahead",
                    n,
                    "nt",
                    "notransfer",
                    kv_budget_gb=B,
                    extra={"no_transfer": True},
                )
            )
        if fused:
            if 16 not in la and 16 not in cands:
                sparse.append(Run(f"{tag}-lookahead-16", ctx, "lookahead", 16, "la", kv_budget_gb=B))
            sparse.append(
                Run(
                    f"{tag}-lookahead-16-unfused",
                    ctx,
                    "lookahead",
                    16,
                    "fused",
                    "unfused",
                    kv_budget_gb=B,
                    extra={"fused_ops": False},
                )
            )
        sn = spec_for(a.sens_n, ctx)
        sns = sorted(set(la + cands) if "all" in sn else {t for t in sn if isinstance(t, int)})
        for n in sns:
            for v in variants:
                needs = f"{tag}-lookahead-{n}" if n in cands else ""
                sens.append(variant_run(v, f"{tag}-", ctx, n, B, d0, z0, needs))
        probe = int(a.probe_n or 0)
        if probe:
            sens.append(
                Run(
                    f"{tag}-lookahead-{probe}-probe",
                    ctx,
                    "lookahead",
                    probe,
                    "probe",
                    kv_budget_gb=B,
                    group=f"{tag}-probe",
                )
            )
    rank = {"max": 0, "la": 0, "nt": 1, "fused": 2}
    sparse.sort(key=lambda r: (-geo.host_gb(r.n, r.ctx), rank[r.kind]))
    sens.sort(key=lambda r: (r.kind == "probe", -geo.host_gb(r.n, r.ctx)))
    return dense + sparse + sens


def plan_first_headline(a, geo: Geometry) -> list:
    """The 2026-11-30 headline plan (run 5), its labels unchanged."""
    ctx, B = a.contexts[0], a.kv_budget_gb
    dn = [geo.lanes("dense", ctx, B) if t == "max" else t for t in spec_for(a.dense_n, ctx)]
    runs = [Run(f"dense-{n}", ctx, "dense", n, "dense", kv_budget_gb=B, group="dense") for n in dn[:1]]
    for n in spec_for(a.max_n, ctx):
        runs.append(Run(f"lookahead-{n}", ctx, "lookahead", n, "max", kv_budget_gb=B, group="max"))
    for n in spec_for(a.la_n, ctx):
        runs.append(Run(f"lookahead-{n}", ctx, "lookahead", n, "la", kv_budget_gb=B, group=f"la{n}"))
        runs.append(
            Run(
                f"lookahead-{n}-notransfer",
                ctx,
                "lookahead",
                n,
                "nt",
                "notransfer",
                kv_budget_gb=B,
                extra={"no_transfer": True},
                group=f"nt{n}",
            )
        )
    if int(a.probe_n or 0):
        n = int(a.probe_n)
        runs.append(Run(f"lookahead-{n}-probe", ctx, "lookahead", n, "probe", kv_budget_gb=B, group="probe"))
    return runs


def plan_first_sensitivity(a, geo: Geometry) -> list:
    """The 2026-11-30 sensitivity plan (run 6, formerly a script of its own), its labels unchanged."""
    d0, z0 = _synthetic_defaults()
    ctx, B = a.contexts[0], a.kv_budget_gb
    variants = [v for v in a.variants.split(",") if v and v != "none"]
    dn = [geo.lanes("dense", ctx, B) if t == "max" else t for t in spec_for(a.dense_n, ctx)]
    runs = []
    for i, n in enumerate(spec_for(a.la_n, ctx)):
        runs.append(Run(f"lookahead-{n}-base", ctx, "lookahead", n, "la", "base", kv_budget_gb=B))
        runs += [variant_run(v, "", ctx, n, B, d0, z0) for v in variants]
        if i == 0:
            runs += [Run(f"dense-{d}", ctx, "dense", d, "dense", "dense", kv_budget_gb=B) for d in dn[:1]]
    return runs


PLANS = {
    "headline": plan_headline,
    "policies": plan_headline,
    "first-headline": plan_first_headline,
    "first-sensitivity": plan_first_sensitivity,
}


# -- estimates -------------------------------------------------------------------------------------------------------


class PinState:
    """What the process keeps pinned (bytes per piece, pieces), simulated for the plan and read after real runs."""

    def __init__(self, geo: Geometry, cuda: bool):
        self.geo, self.cuda, self.piece, self.n = geo, cuda, 0, 0
        self.first_run, self.first_sparse = True, True
        self.pins = 0  # simulated pinnings

    def need(self, run: Run) -> tuple:
        """(bytes to pin newly, bytes of kept pieces that would be freed first) for ``run``."""
        if not run.sparse:
            return 0, 0
        pool = self.geo.pool_bytes(self.geo.host_gb(run.n, run.ctx))
        if not self.cuda:
            return pool, 0  # pageable, allocated per run
        pieces = 2 * self.geo.m.n_layers
        if self.n >= pieces and self.piece * pieces >= pool:
            return 0, 0
        return pool, self.piece * self.n

    def est_s(self, run: Run, a) -> float:
        new, _ = self.need(run)
        s = 1.5 + (a.warmup + a.steps + 2) * self.geo.tpot_guess_s(run)
        if self.cuda:
            s += new / 1e9 / a.pin_gb_s
            s += FIRST_RUN_S if self.first_run else 0.0
            s += FIRST_SPARSE_S if (run.sparse and self.first_sparse) else 0.0
        return s

    def ran(self, run: Run) -> None:
        """Update after ``run`` (simulated: as if it pinned its pool when it needed a new one)."""
        self.first_run = False
        if run.sparse:
            self.first_sparse = False
            new, _ = self.need(run)
            if new and self.cuda:
                self.piece, self.n = new // (2 * self.geo.m.n_layers), 2 * self.geo.m.n_layers
                self.pins += 1

    def read(self) -> None:
        n, piece = pinned_kept()
        if self.cuda:
            self.n, self.piece = n, piece


def print_plan(runs: list, a, geo: Geometry, log, done: dict) -> None:
    """Log the plan in run order, simulating it: the first host-maximum candidate wins (or the first that passes the
    guard at ``--assume-mem-gb``), pools are pinned once and reused, the budget cuts what would end past it."""
    st = PinState(geo, a.device == "cuda")
    mem = a.assume_mem_gb
    cum, ran, groups, nrun = 0.0, set(), set(), 0
    log(
        f"plan ({a.preset}): {len(runs)} runs, model {geo.m.name}, steps {a.warmup}+{a.steps}, KV budget "
        f"{a.kv_budget_gb:g} GB, budget {a.budget_s:.0f} s, guard: MemAvailable after the pool >= {a.min_free_gb:g} GB"
        + (f" (simulated at MemAvailable {mem:g} GB)" if mem else "")
    )
    for r in runs:
        pool = geo.host_gb(r.n, r.ctx) if r.sparse else 0.0
        new, freed = st.need(r)
        est = st.est_s(r, a)
        note = ""
        if r.label in done:
            note = f"(done: {done[r.label]})"
        elif r.group and r.group in groups:
            note = "(alternative: not run once one ran)"
        elif r.needs and r.needs not in ran:
            note = f"(only if {r.needs} runs)"
        elif r.kind == "probe":
            note = "(only if it is above the host maximum that ran)"
        elif mem is not None and r.sparse and new and mem + freed / 1e9 - new / 1e9 < a.min_free_gb:
            note = f"(guard: skipped, {mem + freed / 1e9:.0f} GB available for a {new / 1e9:.1f} GB pool)"
        elif cum + est > a.budget_s:
            note = "(budget: skipped)"
        if not note:
            cum += est
            nrun += 1
            st.ran(r)
            ran.add(r.label)
            if r.group:
                groups.add(r.group)
            if mem is not None and new:
                mem += freed / 1e9 - new / 1e9
        elif r.label in done and done[r.label] == "ok":
            ran.add(r.label)
            if r.group:
                groups.add(r.group)
        extra = " ".join(f"{k}={v}" for k, v in sorted(r.extra.items()))
        log(
            f"plan {r.label:<28} {r.kind:<6} n={r.n:3d} kv={r.kv_budget_gb:3.0f}GB fr={r.fetch_ratio:.2f} "
            f"syn={json.dumps(r.synthetic, separators=(',', ':')) if r.synthetic else '-'} {extra} "
            f"pool={pool:5.1f}GB pin={new / 1e9:5.1f}GB ~{est:3.0f}s cum={cum:4.0f}s {note}".rstrip()
        )
    from oasis_exec.kv.layout import VICTIM_FACTOR  # the engine's victim cache, where a run's requests fit it

    for ctx in a.contexts:
        pools = [geo.host_gb(r.n, r.ctx) for r in runs if r.sparse and r.ctx == ctx and r.label in ran]
        log(
            f"context {ctx}: dense lanes at {a.kv_budget_gb:g} GB = {geo.lanes('dense', ctx, a.kv_budget_gb)}, "
            f"lookahead GPU lanes at {a.kv_budget_gb:g} GB = {geo.lanes('lookahead', ctx, a.kv_budget_gb)} at S = K, "
            f"{geo.lanes('lookahead', ctx, a.kv_budget_gb, VICTIM_FACTOR * TOP_K)} at S = {VICTIM_FACTOR}K "
            f"(the engine's victim cache where a run's requests fit it); "
            f"host pool {geo.per_request_gb(ctx):.3f} GB a request; largest pool of the plan "
            f"{max(pools) if pools else 0:.1f} GB"
        )
    peak = max([geo.host_gb(r.n, r.ctx) for r in runs if r.sparse and r.label in ran] or [0.0])
    log(
        f"estimate: {nrun} runs, ~{cum:.0f} s (pinning at {a.pin_gb_s:g} GB/s); the process pins at most "
        f"{peak:.1f} GB" + (", once" if st.pins <= 1 else f", {st.pins} times")
    )


# -- running ---------------------------------------------------------------------------------------------------------


REPEATED = ("dense", "la", "nt", "sens")  # kinds --repeat runs again (not the host-maximum groups, probes, anchors)


def with_repeats(runs: list, n: int) -> list:
    """The plan, then ``n - 1`` more passes over its runs of the ``REPEATED`` kinds in the same order (so the largest
    pool is still pinned first), labelled ``-r2``, ``-r3``, ...; a record's ``repeat`` says its pass, and
    ``baselines_table.py`` pairs each run with the no-transfer twin of its own pass."""
    from dataclasses import replace

    again = [r for r in runs if r.kind in REPEATED]
    return runs + [replace(r, label=f"{r.label}-r{i}", repeat=i) for i in range(2, n + 1) for r in again]


def load_done(path: str) -> tuple:
    """({label: 'ok'|'error'} of finished runs, [labels whose last line is 'started': the run took the process down],
    {label: record} of ok runs). 'skipped' runs are not finished: a later invocation evaluates them again."""
    from experiments.common.reporting import read_jsonl

    last, ok = {}, {}
    for r in read_jsonl(path):
        if "label" not in r:
            continue
        last[r["label"]] = r.get("status", "ok")
        if last[r["label"]] == "ok":
            ok[r["label"]] = r
    died = [k for k, v in last.items() if v == "started" and k not in ok]
    done = {k: ("ok" if k in ok else v) for k, v in last.items() if k in ok or v == "error"}
    return done, died, ok


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--out", required=True, help="JSON lines, appended; resumes by label")
    ap.add_argument("--preset", default="headline", choices=sorted(PRESETS), help="plan and its defaults")
    ap.add_argument("--contexts", "--context", default=None, help="contexts in tokens, e.g. 16384,32768 or 16k,32k")
    spec = "per context: '8,16' (every context) or '16k=8,16;32k=4' (repeatable); 'none' = no runs"
    ap.add_argument(
        "--dense-n", action="append", help=f"dense concurrencies at the budget ('max' = the engine's); {spec}"
    )
    ap.add_argument("--la-n", action="append", help=f"lookahead concurrencies; {spec}")
    ap.add_argument(
        "--max-n", action="append", help=f"host-maximum candidates, largest first; the first that runs wins; {spec}"
    )
    ap.add_argument("--nt-n", action="append", help=f"--no-transfer twins (the overlap reference); {spec}")
    ap.add_argument("--sens-n", action="append", help=f"where the variants run ('all' = every lookahead n); {spec}")
    ap.add_argument("--anchors", action="append", help=f"whole-GPU dense anchors at --anchor-kv-gb; {spec}")
    ap.add_argument(
        "--variants",
        default=None,
        help="sensitivity variants: driftK (K x the default drift_rate), frX (fetch ratio X); none",
    )
    ap.add_argument(
        "--synthetic",
        default=None,
        type=json.loads,
        help="SyntheticParams overrides (JSON) for every sparse run, under each variant's, e.g. '{\"preset\": \"smollm2\"}'",
    )
    ap.add_argument("--probe-n", default=None, help="a lookahead probe above the host maximum; 0 = none")
    ap.add_argument(
        "--fused-ab", action="store_true", help="fused_ops=False twins of dense-8 and lookahead-16 (first context)"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="launch no run whose estimate ends past this (s)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--kv-budget-gb", type=float, default=52.0)
    ap.add_argument("--anchor-kv-gb", type=float, default=120.0, help="KV budget of the whole-GPU dense anchors")
    ap.add_argument(
        "--min-free-gb",
        type=float,
        default=12.0,
        help="host-memory guard: MemAvailable that must be left after a new pool",
    )
    ap.add_argument("--pin-gb-s", type=float, default=2.7, help="estimate: host pool pinning rate")
    ap.add_argument(
        "--assume-mem-gb", type=float, default=None, help="--dry-run: simulate the guard at this MemAvailable (GB)"
    )
    ap.add_argument(
        "--exec",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an ExecConfig field for every run (repeatable; a variant's set= overrides it), e.g. decode_chain=8",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="passes over the plan's dense, lookahead, twin and variant runs (labels of passes 2.. end -rK): a "
        "spread to compare with, since two runs of one configuration in one call differed by up to 5%%",
    )
    ap.add_argument(
        "--synthetic-work",
        default="model",
        choices=("model", "live"),
        help="the synthetic selection's GPU work in the sparse runs: model (default since 2026-12-02: every pass's "
        "sets drawn before the timed steps and the model selection's top-K run in each layer, the GPU work of a "
        "model-selected step; ExecConfig.synthetic_ahead, synthetic_topk) | live (the generator beside each step "
        "and no top-K, as every earlier figure)",
    )
    ap.add_argument(
        "--transfer",
        default="auto",
        help="the sparse runs' transfer (ExecConfig.transfer): auto, the engine's own choice from "
        "oasis_exec/transfer/table.json (default; before 2026-12-02 it was uva, i.e. 32 programs), uva or host",
    )
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test with --model tiny")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its time estimate, run nothing")
    a = ap.parse_args(argv)
    p = PRESETS[a.preset]
    a.contexts = [parse_ctx(c) for c in (a.contexts or p["contexts"]).split(",") if c.strip()]
    for k in ("dense_n", "la_n", "max_n", "nt_n", "sens_n", "anchors"):
        setattr(a, k, parse_spec(getattr(a, k), p[k]))
    for k in ("variants", "probe_n", "budget_s", "steps", "warmup"):
        if getattr(a, k) is None:
            setattr(a, k, p[k])
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - t0:5.0f}s] {msg}", flush=True)

    a.exec_fields = exec_fields(a.exec)
    from oasis_exec.config import ExecConfig

    set_fields = [variant_params(v, 0.0, 0.0)[2] for v in a.variants.split(",") if v.startswith("set=")]
    chain0 = a.exec_fields.get("decode_chain", ExecConfig.decode_chain)
    chains = [chain0] + [f.get("decode_chain", chain0) for f in set_fields]
    if any("host_kv_dtype" in f for f in set_fields):
        raise SystemExit(
            "h200_headline: host_kv_dtype sizes the one pool of the process: give it as --exec, not a variant"
        )
    host_dtype = a.exec_fields.get("host_kv_dtype", "auto")
    geo = Geometry(a.model, a.device, a.steps, a.warmup, step_tokens=max(chains), host_kv_dtype=host_dtype)
    if a.repeat < 1:
        raise SystemExit(f"h200_headline: --repeat must be >= 1, got {a.repeat}")
    runs = with_repeats(PLANS[a.preset](a, geo), a.repeat)
    done, died, ok_recs = load_done(a.out)
    print_plan(runs, a, geo, log, done)
    if a.dry_run:
        return 0

    import gc

    import torch

    from oasis_exec.config import ExecConfig
    from oasis_exec.tools.bench import run_bench

    def write(rec):
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")

    by_label = {r.label: r for r in runs}
    for label in died:  # a run that took the process down (e.g. killed while pinning): an error, not retried
        r = by_label.get(label)
        rec = {
            "label": label,
            "status": "error",
            "error": "the process died during this run (no record written: "
            "killed, e.g. out of host memory while pinning, or the call's timeout)",
        }
        if r is not None:
            rec.update(
                kind=r.kind,
                variant=r.variant,
                group=r.group,
                mode=r.mode,
                context=r.ctx,
                concurrency=r.n,
                host_kv_gb=geo.host_gb(r.n, r.ctx) if r.sparse else None,
            )
        write(rec)
        done[label] = "error"
        log(f"FAIL  {label}: died in an earlier invocation")
    ok_labels = set(ok_recs)
    groups_ok = {by_label[lb].group for lb in ok_labels if lb in by_label and by_label[lb].group}
    max_ok = {}
    for lb in ok_labels:
        r = by_label.get(lb)
        if r is not None and r.kind == "max":
            max_ok[r.ctx] = max(max_ok.get(r.ctx, 0), ok_recs[lb].get("concurrency", r.n))
    cuda = a.device == "cuda"
    st = PinState(geo, cuda)
    st.first_run = True
    for r in runs:
        if r.label in done or (r.group and r.group in groups_ok):
            continue
        if r.needs and r.needs not in ok_labels:
            log(f"skip  {r.label}: {r.needs} did not run")
            continue
        if r.kind == "probe" and (r.ctx not in max_ok or r.n <= max_ok[r.ctx]):
            log(f"skip  {r.label}: no host maximum below it ran")
            continue
        sparse = r.sparse
        host_kv_gb = geo.host_gb(r.n, r.ctx) if sparse else None
        base = {
            "label": r.label,
            "kind": r.kind,
            "variant": r.variant,
            "group": r.group,
            "preset": a.preset,
            "mode": r.mode,
            "context": r.ctx,
            "concurrency": r.n,
            "requested_concurrency": r.n,
            "kv_budget_gb": r.kv_budget_gb,
            "host_kv_gb": host_kv_gb,
            "fetch_ratio": r.fetch_ratio,
            "synthetic_params": r.synthetic,
            "repeat": r.repeat,
        }
        if cuda:
            st.read()
        est = st.est_s(r, a)
        mem = meminfo()
        new, freed = st.need(r)
        mem_rec = {
            "mem_total_gb": round(mem["MemTotal"], 2) if "MemTotal" in mem else None,
            "mem_available_gb": round(mem["MemAvailable"], 2) if "MemAvailable" in mem else None,
            "pinned_before_gb": round(st.piece * st.n / 1e9, 2),
            "new_pin_gb": round(new / 1e9, 2),
            "min_free_gb": a.min_free_gb,
        }
        if sparse and new and "MemAvailable" in mem:
            after = mem["MemAvailable"] + freed / 1e9 - new / 1e9
            if after < a.min_free_gb:
                write(
                    dict(
                        base,
                        **mem_rec,
                        status="skipped",
                        reason=f"host memory: MemAvailable {mem['MemAvailable']:.1f} GB + {freed / 1e9:.1f} GB kept "
                        f"pool - {new / 1e9:.1f} GB new pool = {after:.1f} GB < {a.min_free_gb:g} GB",
                    )
                )
                log(f"skip  {r.label}: host memory ({after:.1f} GB would be left)")
                continue
        left = a.budget_s - (time.perf_counter() - t0)
        if est > left:
            write(dict(base, **mem_rec, status="skipped", reason=f"budget: {left:.0f} s left, estimate {est:.0f} s"))
            log(f"skip  {r.label}: budget ({left:.0f} s left, ~{est:.0f} s)")
            continue
        kw = dict(
            model=a.model,
            device=a.device,
            dtype="bfloat16" if cuda else "float32",
            selection="synthetic",
            top_k=TOP_K,
            block_size=BS,
            fetch_ratio=r.fetch_ratio,
            max_context=geo.max_context(r.ctx),
            kv_budget_gb=r.kv_budget_gb,
            host_kv_gb=host_kv_gb,
            max_lanes=r.n,
            transfer=a.transfer if sparse else "auto",
            mode=r.mode,
            synthetic={**(a.synthetic or {}), **(r.synthetic or {})} or None if sparse else None,
        )
        if sparse and a.synthetic_work == "model":  # sets for every pass of the run (and a few over), drawn first
            kw.update(synthetic_ahead=(a.warmup + a.steps) * max(chains) + 8, synthetic_topk=True)
        cfg = ExecConfig(**{**kw, **a.exec_fields, **r.extra})  # --exec and a variant's fields override (transfer too)
        write(dict(base, **mem_rec, status="started", est_s=round(est, 1)))
        log(f"start {r.label} (~{est:.0f} s{f', pins {new / 1e9:.1f} GB' if new and cuda else ''})")
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            rec = run_bench(cfg, r.ctx, r.n, a.steps, a.warmup, host_fill=False)
            d0, _ = _synthetic_defaults()
            rec.update(
                label=r.label,
                kind=r.kind,
                variant=r.variant,
                group=r.group,
                repeat=r.repeat,
                preset=a.preset,
                status="ok",
                wall_s=round(time.perf_counter() - t1, 1),
                est_s=round(est, 1),
                cuda_graph=bool(cuda and cfg.cuda_graph and not cfg.profile),
                fused_ops=cfg.fused_ops,
                drift_rate=(r.synthetic or {}).get("drift_rate", d0) if sparse else None,
                **mem_rec,
            )
            if rec["concurrency"] < r.n:
                rec["status_note"] = f"admitted {rec['concurrency']} of {r.n}"
            ok_labels.add(r.label)
            if r.group:
                groups_ok.add(r.group)
            if r.kind in ("max", "probe"):
                max_ok[r.ctx] = max(max_ok.get(r.ctx, 0), rec["concurrency"])
            log(
                f"done  {r.label}: n={rec['concurrency']} tok/s={rec['throughput_tok_s']:.1f} "
                f"p50={rec['tpot_ms_p50']:.2f} p99={rec['tpot_ms_p99']:.2f} ms "
                f"MB/step={rec['bytes_moved_per_step'] / 1e6:.1f} build={rec['build_s']:.1f} s wall={rec['wall_s']} s"
            )
        except Exception as e:  # one failed configuration must not lose the others
            rec = dict(
                base,
                **mem_rec,
                status="error",
                wall_s=round(time.perf_counter() - t1, 1),
                error=" ".join(f"{type(e).__name__}: {e}".split())[:400],
            )
            log(f"FAIL  {r.label}: {rec['error']}")
        write(rec)
        if rec["status"] == "error" and any(m in rec["error"] for m in STICKY_CUDA_ERRORS):
            log("the CUDA context is unusable after this error: exiting (rc 3) so that a fresh process resumes")
            return 3
        st.first_run = False
        if sparse:
            st.first_sparse = False
            if not cuda:
                st.ran(r)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    log("sweep done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
