"""Hardware as SimPy resources: memory pools, streams, copy paths and a max-min fair network link.

Units: bytes, seconds, bytes per second. Nothing here decides policy; it only says how long moving bytes takes and
who holds how much memory.

- :class:`MemoryPool` — a ``simpy.Container`` of bytes (HBM of a GPU, host DRAM of a node) with synchronous
  ``try_reserve``/``release`` for the scheduler's admission checks, a peak and an occupancy series.
- :class:`CopyPath` — one direction of a host↔GPU path: a FIFO ``simpy.Resource`` of capacity 1; a transfer of ``n``
  bytes holds it for ``latency_s + n / bandwidth_Bps``.
- :class:`FairLink` — a NIC whose bandwidth is shared max-min fairly among the flows in flight; rates are recomputed
  whenever a flow starts or ends (water-filling over optional per-flow rate caps).
- :class:`GPU` / :class:`Node` — the bundles the engine uses: HBM, compute stream, side streams, h2d/d2h paths, the
  share of SMs a direct-read gather takes from compute; host DRAM and a NIC per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy


class MemoryPool(simpy.Container):
    """A capacity in bytes. ``try_reserve`` never blocks: it either takes the bytes now or returns False."""

    def __init__(self, env: simpy.Environment, capacity_bytes: float, name: str, track: bool = True):
        super().__init__(env, capacity=max(float(capacity_bytes), 1.0), init=0)
        self.name = name
        self.peak = 0.0
        self.track = track
        self.series: list[tuple[float, float]] = [(0.0, 0.0)]  # (time_s, bytes in use)

    @property
    def free(self) -> float:
        return self.capacity - self.level

    # The scheduler never waits on memory, so reserve/release change the Container's level directly (what an
    # immediately granted put/get would do) without creating SimPy events: ~10x cheaper on the decode hot path.
    # Processes that want to block on the pool may still ``yield pool.put(n)``; reserve/release wake them.
    def try_reserve(self, nbytes: float) -> bool:
        if nbytes <= 0:
            return True
        if nbytes > self._capacity - self._level:
            return False
        self._level += nbytes
        self._note()
        if self.get_queue:
            self._trigger_get(None)
        return True

    def release(self, nbytes: float) -> None:
        if nbytes <= 0:
            return
        self._level -= min(nbytes, self._level)
        self._note()
        if self.put_queue:
            self._trigger_put(None)

    def _note(self) -> None:
        lvl = self._level
        if lvl > self.peak:
            self.peak = lvl
        if self.track:
            now = self._env._now
            series = self.series
            if series and series[-1][0] == now:
                series[-1] = (now, lvl)
            else:
                series.append((now, lvl))


class CopyPath:
    """One direction of a copy path (host→GPU or GPU→host): FIFO, one transfer at a time."""

    def __init__(self, env: simpy.Environment, bandwidth_Bps: float, latency_s: float, name: str):
        if bandwidth_Bps <= 0:
            raise ValueError(f"{name}: bandwidth_Bps must be > 0, got {bandwidth_Bps}")
        self.env = env
        self.name = name
        self.bandwidth_Bps = float(bandwidth_Bps)
        self.latency_s = float(latency_s)
        self.resource = simpy.Resource(env, capacity=1)
        self.bytes_moved = 0.0
        self.busy_s = 0.0

    def duration(self, nbytes: float) -> float:
        """Seconds one transfer of ``nbytes`` holds the path (0 bytes: no transfer, no latency)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_s + nbytes / self.bandwidth_Bps

    def account(self, nbytes: float, seconds: float) -> None:
        self.bytes_moved += nbytes
        self.busy_s += seconds

    def transfer(self, nbytes: float):
        """SimPy process: wait for the path, hold it for :meth:`duration`, release it."""
        with self.resource.request() as req:
            yield req
            d = self.duration(nbytes)
            if d > 0:
                yield self.env.timeout(d)
            self.account(nbytes, d)


@dataclass
class _Flow:
    fid: int
    remaining: float
    cap_Bps: float
    done: simpy.Event
    rate: float = 0.0
    tag: str = ""


def maxmin_rates(capacity: float, caps: list[float]) -> list[float]:
    """Water-filling: the max-min fair rates of flows with rate caps ``caps`` sharing ``capacity``."""
    n = len(caps)
    rates = [0.0] * n
    left = capacity
    order = sorted(range(n), key=lambda i: (caps[i], i))
    remaining_flows = n
    for i in order:
        share = left / remaining_flows
        r = caps[i] if caps[i] < share else share
        rates[i] = r
        left -= r
        remaining_flows -= 1
    return rates


class FairLink:
    """A link of ``bandwidth_Bps`` shared max-min fairly by concurrent flows.

    ``send(nbytes, cap_Bps=inf)`` returns an event that fires when the flow's last byte has crossed. After an
    optional per-flow ``latency_s`` the flow joins; every join or completion advances all flows at their old rates
    and recomputes the rates. ``log`` (if given) receives ``(time_s, tag, 'start'|'end', fid)``.
    """

    def __init__(
        self, env: simpy.Environment, bandwidth_Bps: float, latency_s: float = 0.0, name: str = "nic", log=None
    ):
        if bandwidth_Bps <= 0:
            raise ValueError(f"{name}: bandwidth_Bps must be > 0, got {bandwidth_Bps}")
        self.env = env
        self.name = name
        self.bandwidth_Bps = float(bandwidth_Bps)
        self.latency_s = float(latency_s)
        self.flows: dict[int, _Flow] = {}
        self.bytes_moved = 0.0
        self._next_id = 0
        self._last_t = env.now
        self._gen = 0
        self.log = log

    @property
    def n_active(self) -> int:
        return len(self.flows)

    def fair_share_Bps(self, extra_flows: int = 1) -> float:
        """The rate a new uncapped flow would get if it joined now (used by the closed-form step timing)."""
        caps = [f.cap_Bps for f in self.flows.values()] + [float("inf")] * extra_flows
        return maxmin_rates(self.bandwidth_Bps, caps)[-1]

    def send(self, nbytes: float, cap_Bps: float = float("inf"), tag: str = "") -> simpy.Event:
        done = self.env.event()
        if nbytes <= 0:
            done.succeed(0.0)
            return done
        fid = self._next_id
        self._next_id += 1
        if self.latency_s > 0:
            t = self.env.timeout(self.latency_s)
            t.callbacks.append(lambda _e: self._join(_Flow(fid, float(nbytes), cap_Bps, done, tag=tag)))
        else:
            self._join(_Flow(fid, float(nbytes), cap_Bps, done, tag=tag))
        return done

    # -- internals -------------------------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last_t
        if dt > 0:
            for f in self.flows.values():
                moved = f.rate * dt
                f.remaining -= moved
                self.bytes_moved += moved
        self._last_t = now

    def _join(self, flow: _Flow) -> None:
        self._advance()
        self.flows[flow.fid] = flow
        if self.log is not None:
            self.log(self.env.now, flow.tag, "start", flow.fid)
        self._reschedule()

    def _reschedule(self) -> None:
        ids = sorted(self.flows)
        if not ids:
            return
        rates = maxmin_rates(self.bandwidth_Bps, [self.flows[i].cap_Bps for i in ids])
        for i, r in zip(ids, rates):
            self.flows[i].rate = r
        dt = min(self.flows[i].remaining / self.flows[i].rate for i in ids)
        self._gen += 1
        gen = self._gen
        t = self.env.timeout(max(dt, 0.0))
        t.callbacks.append(lambda _e: self._on_timer(gen))

    def _on_timer(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later join/finish
        self._advance()
        # A flow is done when its remaining bytes are within rounding of zero.
        finished = [f for f in self.flows.values() if f.remaining <= 1e-9 * max(1.0, f.rate)]
        for f in sorted(finished, key=lambda f: f.fid):
            self.bytes_moved += f.remaining  # book the rounding residue
            del self.flows[f.fid]
            if self.log is not None:
                self.log(self.env.now, f.tag, "end", f.fid)
            f.done.succeed(self.env.now)
        self._reschedule()


@dataclass
class GPU:
    """One GPU: HBM pool, the compute stream, side streams for background stages, one copy path per direction.

    ``gather_sm_share``: the share of SMs a direct-read (UVA) gather kernel takes from compute while it runs
    (0 for the DMA path).
    """

    env: simpy.Environment
    hbm: MemoryPool
    h2d: CopyPath
    d2h: CopyPath
    gather_sm_share: float = 0.0
    n_side_streams: int = 2
    compute: simpy.Resource = field(init=False)
    side: simpy.Resource = field(init=False)

    def __post_init__(self):
        self.compute = simpy.Resource(self.env, capacity=1)
        self.side = simpy.Resource(self.env, capacity=self.n_side_streams)


@dataclass
class Node:
    """A server: host DRAM, its GPUs (one per node is modelled), a NIC."""

    env: simpy.Environment
    name: str
    host: MemoryPool
    gpu: GPU
    nic: FairLink | None = None
