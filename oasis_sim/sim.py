"""Build and run one simulation: ``simulate(cfg, trace) -> SimResult``.

Wiring: ``SimConfig`` → specs (``oasis_core.specs``), KV geometry, predictor, one decode ``Node`` (HBM, host DRAM,
compute/side streams, copy paths) → ``SimScheduler`` (``oasis_core.scheduler``) + ``SimEngine`` (+ ``split.PrefillNode`` and a NIC when
``split != 'none'``) → the workload (trace, closed loop or Poisson) → ``env.run()`` → metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import simpy

from oasis_core import modes
from oasis_core.echo import show
from oasis_core.geometry import KVGeometry
from oasis_core.token_scorer import geometry_rank
from oasis_core.trace import Trace

from . import metrics
from .config import ConfigError, SimConfig
from .engine import SimEngine
from .hardware import GPU, CopyPath, FairLink, MemoryPool, Node
from .policy import PolicySource
from .predictor import RooflinePredictor, TimePredictor
from .scheduler import SimScheduler
from .timeline import Timeline
from .workloads import ClosedLoop, make_requests

# Effective share of the PCIe link that scattered block copies reach (DESIGN.md: the paper's PCIe saturates at
# 30-34 GB/s effective; our host gather + DMA path measured 28.6-30.6 GB/s): 0.55 x 55.3 GB/s = 30.4 GB/s.
SCATTER_EFFICIENCY = 0.55


@dataclass
class SimResult:
    summary: dict
    requests: list = field(default_factory=list)  # rows of requests.csv
    steps: object = None  # engine.StepLog
    memory: dict = field(default_factory=dict)  # pool -> [(t, bytes)]
    timeline: Timeline | None = None
    wall_s: float = 0.0
    events: int = 0

    def files(self) -> dict:
        """name -> text of every deterministic output file."""
        out = {
            "summary.json": metrics.dumps_summary(self.summary),
            "requests.csv": metrics.dumps_csv(self.requests, metrics.REQUEST_COLUMNS),
            "steps.csv": metrics.steps_csv(self.steps),
            "memory.csv": metrics.memory_csv(self.memory),
        }
        if self.timeline is not None:
            out["timeline.json"] = self.timeline.to_json()
        return out


def build_node(env, cfg: SimConfig, name: str, hbm_for_kv: float, host_bytes: float) -> Node:
    hw = cfg.hardware_spec
    link = hw.link
    h2d_Bps = cfg.h2d_bytes_per_s or hw.h2d_bytes_per_s * SCATTER_EFFICIENCY
    gpu = GPU(
        env,
        MemoryPool(env, hbm_for_kv, f"{name}.hbm"),
        CopyPath(env, h2d_Bps, link.latency_s, f"{name}.h2d"),
        CopyPath(env, hw.d2h_bytes_per_s, link.latency_s, f"{name}.d2h"),
        gather_sm_share=cfg.gather_sm_share if cfg.transfer_path == "uva" else 0.0,
        n_side_streams=1,
    )
    return Node(env, name, MemoryPool(env, host_bytes, f"{name}.host"), gpu)


@dataclass(frozen=True)
class BenchLanes:
    """The executor's view of a GPU KV budget (``oasis_core.lanes``): slots a row, bytes a lane, lanes, host pool."""

    slots: int
    lane_bytes: int
    lanes: int
    host_bytes: float


def bench_lanes(cfg: SimConfig, geo: KVGeometry, reqs) -> BenchLanes:
    """``cfg.kv_budget_gb`` through the executor's rules: lanes of ``max_blocks`` blocks (``max_context``, else the
    longest request plus two blocks, as the bench sizes them), the victim cache for the requests a closed loop keeps
    in flight, and the host pool those requests need."""
    from oasis_core import lanes as rules

    mode = modes.get(cfg.mode)
    bs = cfg.block_size
    longest = max((r.prompt + r.output for r in reqs), default=bs)
    max_blocks = -(-(cfg.max_context or longest + 2 * bs) // bs)
    budget = cfg.kv_budget_gb * 1e9
    wanted = cfg.concurrency if cfg.arrival == "closed" else None
    slots = cfg.resident_slots
    if mode.sparse:
        slots = rules.victim_slots(
            cfg.resident_slots,
            cfg.top_k,
            hot_slots_given=cfg.hot_slots is not None,
            background=mode.background,
            budget_gb=cfg.kv_budget_gb,
            wanted=wanted,
            lane_bytes_of=lambda s: rules.sparse_lane_bytes(geo, s, max_blocks),
        )
        per = rules.sparse_lane_bytes(geo, slots, max_blocks)
    else:
        per = rules.dense_lane_bytes(geo, max_blocks, mode.summaries)
    n = rules.budget_lanes(budget, per)
    if n < 1:
        raise ConfigError(f"kv_budget_gb: one request needs {per / 1e9:.2f} GB, got {cfg.kv_budget_gb!r}")
    host = 0.0
    if mode.sparse:
        block = geo.host_bytes_per_block(cfg.host_kv_dtype)
        host = float(rules.host_pool_blocks(None, n, wanted, max_blocks, block) * block)
    return BenchLanes(slots, per, n, host)


def make_predictor(cfg: SimConfig, predictor: TimePredictor | None = None) -> tuple:
    """(predictor, cfg): ``predictor`` when given, else ``cfg.predictor``'s; the calibrated one also sets the copy
    path's rate and the UVA gather's SM share from its file, unless the config names them."""
    if predictor is not None:
        return predictor, cfg
    model, hw = cfg.model_spec, cfg.hardware_spec
    if cfg.predictor == "roofline":
        return RooflinePredictor(model, hw), cfg
    from .calibrated import CalibratedPredictor, load_calibration

    try:
        cal = load_calibration(cfg.calibration)
    except ValueError as e:
        raise ConfigError(f"calibration: {e}") from None
    pred = CalibratedPredictor(model, hw, cal.params_on(cfg.hardware), cfg.mode, cfg.engine)
    pred.calibration = cal
    kw = {}
    if cfg.h2d_bytes_per_s is None and cfg.transfer_path == "uva":
        kw["h2d_bytes_per_s"] = min(cal.params.copy_bytes_per_s, hw.h2d_bytes_per_s)
    if cfg.gather_sm_share == SimConfig.gather_sm_share:  # the field's default: the calibration's share
        kw["gather_sm_share"] = cal.params.gather_sm_share
    return pred, (cfg.with_(**kw) if kw else cfg)


def simulate(cfg: SimConfig, trace: Trace, predictor: TimePredictor | None = None) -> SimResult:
    wall0 = time.perf_counter()
    env = simpy.Environment()
    model, hw = cfg.model_spec, cfg.hardware_spec
    geo = KVGeometry(model, cfg.block_size, token_rank=geometry_rank(cfg.block_score, model.head_dim, cfg.token_rank))
    reqs = make_requests(trace, cfg)
    lanes = bench_lanes(cfg, geo, reqs) if cfg.kv_budget_gb else None
    if lanes is not None and lanes.slots != cfg.resident_slots:
        cfg = cfg.with_(hot_slots=lanes.slots)  # the executor's victim cache (oasis_core.lanes.victim_slots)
    predictor, cfg = make_predictor(cfg, predictor)
    hbm_total = cfg.hbm_bytes or hw.hbm_bytes
    weights = model.weight_bytes
    hbm_kv = hbm_total * cfg.hbm_utilization - weights
    if cfg.kv_budget_gb:
        hbm_kv = cfg.kv_budget_gb * 1e9  # the executor's budget is KV only: the weights sit outside it
    if hbm_kv <= 0:
        raise ConfigError(
            f"model: its weights ({weights / 1e9:.1f} GB) do not fit the usable HBM of {cfg.hardware} "
            f"({cfg.hbm_utilization} x {hbm_total / 1e9:.1f} GB), got {show(cfg.model)}"
        )
    if cfg.prefix_cache and cfg.prefix_cache_hbm_bytes >= hbm_kv:
        raise ConfigError(
            f"prefix_cache_hbm_bytes: the prefix cache's HBM tier must leave room for KV in the "
            f"{hbm_kv / 1e9:.2f} GB of HBM the weights leave, got {show(cfg.prefix_cache_hbm_bytes)}"
        )
    if cfg.prefix_cache and cfg.split == "none":
        hbm_kv -= cfg.prefix_cache_hbm_bytes  # the HBM tier comes out of the KV pool the scheduler admits against
    host_bytes = cfg.host_bytes or hw.host_dram_bytes_per_gpu * 0.9
    if lanes is not None and lanes.host_bytes and not cfg.host_bytes:
        host_bytes = lanes.host_bytes  # the executor's host pool: what the requests that run need
    node = build_node(env, cfg, "decode", hbm_kv, host_bytes)
    if cfg.decode_only:
        for r in reqs:  # the bench's synthesized prefill: the prompt's KV exists on arrival
            r.prefill_done = r.prompt
    bs = cfg.block_size
    policy = PolicySource(
        cfg,
        [-(-(r.prompt + (r.output + 1) // 2) // bs) for r in reqs],
        max_steps=max((r.output for r in reqs), default=0),
    )
    sched = SimScheduler(cfg, geo, node.gpu.hbm, node.host, policy)
    if lanes is not None and cfg.engine == "oasis":
        sched.acct.lane_bytes = lanes.lane_bytes  # whole lanes reserved at admission, as the executor's stores
    timeline = Timeline() if cfg.timeline_steps > 0 else None

    prefill = prefix = None
    if cfg.split != "none":
        from oasis_core.specs import get_link

        from .split import PrefillNode, RemoteFetcher

        nic_spec = get_link(cfg.nic)
        rate = cfg.nic_bytes_per_s if cfg.nic_bytes_per_s is not None else nic_spec.achieved_bytes_per_s
        latency = cfg.nic_latency_s if cfg.nic_latency_s is not None else nic_spec.latency_s
        node.nic = FairLink(env, rate, latency, "nic")
        remote = RemoteFetcher(cfg, geo, node.nic, sched) if cfg.split == "rpf" else None
        engine = SimEngine(
            env,
            cfg,
            geo,
            node.gpu,
            sched,
            predictor,
            node.gpu.h2d.bandwidth_Bps,
            node.gpu.h2d.latency_s,
            timeline,
            remote,
        )
        prefill = PrefillNode(env, cfg, geo, predictor, node.nic, sched, engine, timeline)
        submit = prefill.submit
    else:
        engine = SimEngine(
            env, cfg, geo, node.gpu, sched, predictor, node.gpu.h2d.bandwidth_Bps, node.gpu.h2d.latency_s, timeline
        )
        if cfg.prefix_cache:
            from .split import PrefixCache

            prefix = PrefixCache(cfg.prefix_cache_hbm_bytes, cfg.prefix_cache_host_bytes, geo.bytes_per_token)

        def submit(r):
            if prefix is not None and r.prefix_ids:
                hit, host_hit = prefix.lookup_insert_tiers(r.prefix_ids, r.prefix_block_tokens)
                r.prefix_hit_tokens = min(hit, r.prompt - 1)
                r.prefill_done = r.prefix_hit_tokens  # cached prefix: no prefill compute
                host_hit = min(host_hit, r.prefix_hit_tokens)
                if host_hit:  # host-tier blocks cross host->GPU before its prefill continues
                    r.ready_t = max(r.ready_t, engine.copy_in(host_hit * geo.bytes_per_token))
            sched.add(r, env.now)
            engine.notify()

    if cfg.arrival == "closed":
        loop = ClosedLoop(reqs, cfg.concurrency, submit)
        sched.on_done = loop.on_done
        more = loop.more
    elif prefill is None and prefix is None:
        # every request queued now, not admitted before its arrival (Request.ready_t): no arrival events; a request
        # that can never fit is rejected at once
        for r in sorted(reqs, key=lambda r: (r.arrival, r.id)):
            sched.add(r, r.arrival)

        def more():
            return False

    else:
        pending = sorted(reqs, key=lambda r: (r.arrival, r.id))

        def arrivals():
            for r in pending:
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                submit(r)

        arr_proc = env.process(arrivals())

        def more():
            return arr_proc.is_alive or (prefill is not None and prefill.busy())

    if prefill is not None:
        base_more = more
        more = lambda: base_more() or prefill.busy()  # noqa: E731
    env.process(engine.run(more))
    env.run()

    rows = metrics.request_rows(sched.done, geo.host_bytes_per_block_head(cfg.host_kv_dtype))
    first_arrival = min((r.arrival for r in reqs), default=0.0)
    end = max((r.finish_t for r in sched.done), default=env.now)
    net = node.nic.bytes_moved if node.nic is not None else 0.0
    extra = {"d2h_busy_s": metrics._r(node.gpu.d2h.busy_s)}
    if prefix is not None:
        extra["prefix_host_copy_bytes"] = round(engine.prefix_copy_bytes)
    if modes.get(cfg.mode).hot_cache:  # hisparse: the share of the selected top-K found in the hot cache
        extra["hot_slots"] = cfg.resident_slots
        extra["hot_hit_rate"] = metrics._r(1.0 - engine.miss_sum / (engine.sel_n * cfg.top_k) if engine.sel_n else 1.0)
    if prefill is not None:
        extra.update(prefill.stats())
    if model.is_hybrid:  # the layer kinds (oasis_sim.layer_kinds): only for a hybrid model, so others keep their bytes
        extra["full_layers"] = list(model.full_layers)
        extra["layer_windows"] = list(model.layer_windows)
        extra["window_kv_bytes"] = geo.window_bytes(max(model.layer_windows, key=lambda w: w or 0))
    if engine.spec_k:  # speculative decoding (engine.py): only when on, so that default runs keep their bytes
        extra.update(engine.spec_summary())
    summary = metrics.summarize(
        cfg,
        rows,
        n_requests=len(reqs),
        rejections=dict(sched.rejections),
        preemptions=sched.preemptions,
        h2d_bytes=engine.h2d_bytes,
        d2h_bytes=engine.d2h_bytes,
        net_bytes=net,
        hbm_peak=node.gpu.hbm.peak,
        host_peak=node.host.peak,
        recall_sum=engine.recall_sum,
        recall_n=engine.recall_n,
        stall_s=engine.stall_s,
        steps=engine.steps,
        end_s=end,
        first_arrival_s=first_arrival,
        extra=extra,
    )
    memory = {"decode.hbm": node.gpu.hbm.series, "decode.host": node.host.series}
    return SimResult(summary, rows, engine.log, memory, timeline, time.perf_counter() - wall0, engine.steps)
