"""Prefill/decode split and the prefix cache.

- :class:`PrefixCache` — prompt-prefix KV blocks keyed by the trace's ``prefix_block_ids`` (blocks of
  ``prefix_block_tokens`` tokens), LRU in two tiers: HBM, then host DRAM (an HBM eviction demotes to host, a host
  eviction drops). ``lookup_insert`` returns the tokens of the leading run of cached blocks and inserts/promotes the
  request's blocks (``lookup_insert_tiers``: those tokens and how many of them came from the host tier). On one node
  (``split='none'``) the HBM tier is taken out of the KV pool the scheduler admits against, and a request's
  host-tier hits are copied host->GPU (``SimEngine.copy_in``) before its prefill continues; the host tier is its own
  budget, outside the host KV pool.
- :class:`PrefillNode` — a prefill GPU (FCFS, one request at a time, chunked at ``chunk_tokens``) that skips the
  prefix it has cached, then hands the request to the decode node over the NIC (a max-min fair
  :class:`~oasis_sim.hardware.FairLink`; hand-offs of different requests share it):

  * ``split='full'``: the whole prompt KV (less blocks the decode node already holds in its prefix cache);
  * ``split='rpf'``: remote partial fetching — the first step's predicted units (``rpf_granularity='block'``: the
    union over a layer's heads; ``'head'``: each head's own set; from the request's
    ``oasis_core.rpf.RemoteLedger`` in ``oasis_sim.policy``), the local block, the block summaries (only with
    ``rpf_send_summaries``, the default) and the draft state; later misses are fetched remotely during decode
    (:class:`RemoteFetcher`), each unit at most once. ``summary.json`` reports the parts separately:
    ``handoff_kv_bytes``, ``handoff_summary_bytes``, ``handoff_draft_bytes`` (their sum is ``handoff_bytes``) and
    the decode-time misses ``rpf_remote_bytes``.

  TTFT in split runs is measured when the hand-off completes (the decode node streams tokens from then on).
  A hybrid model (``ModelSpec.layer_windows``): the full hand-off is the full layers' KV plus the windows
  (``KVGeometry.dense_bytes``); RPF's units are the full layers' and the windows (``window_bytes``) always cross
  with them; the prefill's windowed layers attend their window (``LayerKinds.prefill_past``).
- :class:`RemoteFetcher` — the decode engine's RPF hook: a step's remote misses become one NIC flow; the step's
  layer transfers take ``latency + bytes / fair share`` of the NIC, the share a new flow gets at step start.
  The decode node's host memory holds only what has arrived (hand-off + remote misses + decoded tokens).
"""

from __future__ import annotations

from collections import OrderedDict

from .layer_kinds import LayerKinds
from .scheduler import Req


class PrefixCache:
    def __init__(self, hbm_bytes: float, host_bytes: float, bytes_per_token: float):
        self.hbm: OrderedDict = OrderedDict()
        self.host: OrderedDict = OrderedDict()
        self.hbm_bytes, self.host_bytes, self.bpt = hbm_bytes, host_bytes, bytes_per_token
        self.hits_hbm = self.hits_host = self.lookups = 0

    def _cap(self, tier_bytes: float, block_tokens: int) -> int:
        return int(tier_bytes // (block_tokens * self.bpt))

    def lookup(self, ids, block_tokens: int) -> int:
        """Tokens of the leading run of cached blocks (no state change)."""
        n = 0
        for b in ids:
            if b in self.hbm or b in self.host:
                n += 1
            else:
                break
        return n * block_tokens

    def lookup_insert(self, ids, block_tokens: int) -> int:
        """Tokens of the leading run of cached blocks; inserts the request's blocks (hits promoted to HBM)."""
        return self.lookup_insert_tiers(ids, block_tokens)[0]

    def lookup_insert_tiers(self, ids, block_tokens: int) -> tuple:
        """(tokens of the leading run of cached blocks, tokens of them that were in the host tier): the host-tier
        ones move to the HBM tier, so they cross host->GPU."""
        hit = self.lookup(ids, block_tokens)
        nhit = hit // block_tokens
        self.lookups += 1
        host_blocks = 0
        for j, b in enumerate(ids):
            if j < nhit:
                if b in self.hbm:
                    self.hits_hbm += 1
                    self.hbm.move_to_end(b)
                    continue
                self.hits_host += 1
                host_blocks += 1
                del self.host[b]
            self._put_hbm(b, block_tokens)
        return hit, host_blocks * block_tokens

    def _put_hbm(self, b, block_tokens: int) -> None:
        self.hbm[b] = True
        self.hbm.move_to_end(b)
        cap = self._cap(self.hbm_bytes, block_tokens)
        while len(self.hbm) > cap:
            old, _ = self.hbm.popitem(last=False)
            self.host[old] = True
            host_cap = self._cap(self.host_bytes, block_tokens)
            while len(self.host) > host_cap:
                self.host.popitem(last=False)


class RemoteFetcher:
    def __init__(self, cfg, geo, nic, sched):
        self.cfg, self.geo, self.nic, self.sched = cfg, geo, nic, sched
        self.remote_bytes = 0.0

    def received(self, r: Req, nbytes: float) -> None:
        r.net_bytes += nbytes
        self.remote_bytes += nbytes
        self.sched.regrow_host(r)

    def fetch_s(self, nbytes: float) -> float:
        share = self.nic.fair_share_Bps()
        self.nic.send(nbytes, tag="rpf")
        return self.nic.latency_s + nbytes / share


class PrefillNode:
    def __init__(self, env, cfg, geo, predictor, nic, sched, engine, timeline=None):
        import simpy

        self.env, self.cfg, self.geo, self.pred, self.nic = env, cfg, geo, predictor, nic
        self.sched, self.engine, self.timeline = sched, engine, timeline
        self.queue = simpy.Store(env)
        self.in_flight = 0
        self.cache = None
        self.decode_cache = None
        if cfg.prefix_cache:
            self.cache = PrefixCache(cfg.prefix_cache_hbm_bytes, cfg.prefix_cache_host_bytes, geo.bytes_per_token)
            # The decode node keeps prefix blocks it received in host DRAM: they need not cross again.
            self.decode_cache = PrefixCache(0.0, cfg.prefix_cache_host_bytes, geo.bytes_per_token)
        self.handoff_bytes = 0.0  # = kv + summaries + draft state
        self.handoff_kv_bytes = 0.0
        self.handoff_summary_bytes = 0.0
        self.handoff_draft_bytes = 0.0
        self.full_kv_bytes = 0.0
        self.busy_s = 0.0
        self.prefix_hit_tokens = 0
        env.process(self._run())

    def busy(self) -> bool:
        return self.in_flight > 0

    def submit(self, r: Req) -> None:
        self.in_flight += 1
        self.queue.put(r)

    def _prefill_s(self, tokens: int, past: int) -> float:
        p, L = self.pred, self.geo.model.n_layers
        kinds = LayerKinds(self.geo.model)
        t = p.time("step_overhead", {}) + p.time("lm_head", {"tokens": 1})
        done = 0
        while done < tokens:
            n = min(self.cfg.chunk_tokens, tokens - done)
            per_layer = (
                p.time("gemm_layer", {"tokens": n})
                + p.time("norm_rope", {"tokens": n})
                + p.time("attn_prefill", {"tokens": n, "past_tokens": past + done})
            )
            if kinds.hybrid:  # the windowed layers attend their window: their attention replaces the full one's
                full_attn = p.time("attn_prefill", {"tokens": n, "past_tokens": past + done})
                t += L * (per_layer - full_attn) + kinds.n_full * full_attn
                for w, k in kinds.count.items():
                    wpast = kinds.prefill_past(n, past + done, w)
                    t += k * p.time("attn_prefill", {"tokens": n, "past_tokens": wpast})
            else:
                t += L * per_layer
            done += n
        return t

    def _run(self):
        env = self.env
        while True:
            r = yield self.queue.get()
            hit = 0
            if self.cache is not None and r.prefix_ids:
                hit = min(self.cache.lookup_insert(r.prefix_ids, r.prefix_block_tokens), r.prompt - 1)
            r.prefix_hit_tokens = hit
            self.prefix_hit_tokens += hit
            d = self._prefill_s(r.prompt - hit, hit)
            self.busy_s += d
            yield env.timeout(d)
            r.prefill_done = r.prompt
            r.prefill_target = r.prompt
            r.generated = 1
            env.process(self._handoff(r))

    def _handoff(self, r: Req):
        env, geo, cfg = self.env, self.geo, self.cfg
        n_blocks = -(-r.prompt // cfg.block_size)
        full = geo.dense_bytes(n_blocks * cfg.block_size)  # n_blocks * block_size * bytes_per_token without windows
        keep = 1.0
        if self.decode_cache is not None and r.prefix_ids:
            local = min(self.decode_cache.lookup_insert(r.prefix_ids, r.prefix_block_tokens), r.prompt)
            keep = 1.0 - local / r.prompt
        self.sched.ensure_policy(r)
        if cfg.split == "full" or r.policy is None:
            kv, summ, draft = full * keep, 0.0, 0.0
        else:
            rows = geo.rows_per_request
            units = r.policy.handoff_units() * rows
            kv = units * geo.bytes_per_block_head * keep + geo.window_bytes(r.prompt)  # the windows: whole
            summ = geo.summary_bytes(r.prompt) * keep if cfg.rpf_send_summaries else 0.0
            draft = cfg.draft_state_bytes
        nbytes = kv + summ + draft
        self.full_kv_bytes += full
        self.handoff_bytes += nbytes
        self.handoff_kv_bytes += kv
        self.handoff_summary_bytes += summ
        self.handoff_draft_bytes += draft
        t0 = env.now
        yield self.nic.send(nbytes, tag="handoff")
        if self.timeline is not None and len(self.timeline.events) < 20000:
            self.timeline.add_flow(f"handoff r{r.id}", t0, env.now, nbytes)
        r.net_bytes += nbytes
        r.first_token_t = env.now
        r.ready_t = env.now
        self.in_flight -= 1
        self.sched.add(r, env.now)
        self.engine.notify()

    def stats(self) -> dict:
        remote = self.engine.remote.remote_bytes if self.engine.remote is not None else 0.0
        return {
            "handoff_bytes": round(self.handoff_bytes),
            "handoff_full_kv_bytes": round(self.full_kv_bytes),
            "handoff_kv_bytes": round(self.handoff_kv_bytes),
            "handoff_summary_bytes": round(self.handoff_summary_bytes),
            "handoff_draft_bytes": round(self.handoff_draft_bytes),
            "rpf_remote_bytes": round(remote),
            "rpf_granularity": self.cfg.rpf_granularity,
            "rpf_send_summaries": self.cfg.rpf_send_summaries,
            "prefill_busy_s": round(self.busy_s, 6),
            "prefix_hit_tokens": self.prefix_hit_tokens,
        }
