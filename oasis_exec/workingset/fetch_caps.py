"""The executor's fetch caps: the run's ``oasis_core.fetchcap`` policy, evaluated on the device.

``DeviceCaps.cap(layer, resident, pred)`` is the cap of one layer's plan (its rows are that layer's (lane, KV head)
rows): an int for a static policy (``Fixed``, ``Unlimited``: the value every step, as before the policies ran
here), else whatever the policy returns for a ``CapContext`` whose arrays live on the device, an int64 tensor [R]
that ``oasis_kernels.plan_select`` / ``plan_step`` read per row. The policy's code is the core's, unchanged; nothing here
synchronises the host, so the caps run inside a captured CUDA graph too.

Context the executor fills: ``n_missing`` (``selection.count_missing`` of the rows against the prediction, on the
device), ``last_step_time_s`` (the previous decode step's duration as a 0-d float64 device tensor, from
``StepClock``; None before the first decode step), ``link_bytes_per_s`` (``ExecConfig.link_gb_s``),
``bytes_per_block_head`` (``KVGeometry``) and ``row_weight = fetch_layers`` (one layer's rows are planned per call,
each standing for its row in every layer that fetches, so a byte budget for the whole step is shared by those
layers: every layer, or a hybrid model's full layers, its windowed ones fetching nothing).
``drift_so_far`` is not tracked (None), ``bytes_moved_total`` stays 0 and ``step`` is the decode-step count when
the cap was evaluated (frozen at capture under CUDA graphs): a policy that reads them is eager-only here.

Per-row and per-layer context: ``n_predicted`` (valid entries of ``pred``), ``layer`` (the call's layer) and
``layers = n_layers``. A policy's state lives here, on the device, allocated once: ``layer_state`` [n_layers, V]
(passed whole) and ``row_state`` [n_layers, state_rows, W], of which a call passes its rows' slice. With ``rows``
(the store row ids of the call's rows, an int64 device tensor) the slice is gathered at those rows and written back
after the policy updated it, so a row's state follows its lane; without ``rows`` the call's rows are taken as the
store's rows ``0 .. R-1`` (exact when the lanes are a prefix). ``state_rows`` defaults to the first call's row
count, grown (and its new rows initialised) on the host when a later call has more: give the store's row count to
allocate it before any CUDA-graph capture. A lane's state carries over to the next request in that lane; the
moving averages forget it within a few steps.

Step time: ``StepClock`` stamps the main stream at the start and end of each decode step (``oasis_kernels.step_clock``
on CUDA, the host clock on CPU), so ``ns[1]`` holds the last step's nanoseconds and ``seconds = ns[1] * 1e-9``.
Layer l's cap of step t is planned on the prediction stream, which may still run when step t + 1 begins, so each
layer reads its own copy ``layer_s[l]``, refreshed on the main stream once that layer's transfer of the previous
step was waited for (``layer_ready``, called by ``Prefetcher.wait``): by then the previous step's planning of layer
l has read its copy, and this step's has not begun.
"""

from __future__ import annotations

from numbers import Integral

import torch

from oasis_core.fetchcap import CapContext, FetchCapPolicy, state_array
from oasis_core.selection import count_missing


class StepClock:
    """Duration of the last decode step on the device: ``ns`` int64 [2] (start, last duration) and ``seconds``."""

    def __init__(self, *, device: torch.device):
        self.device = device
        self.ns = torch.zeros(2, dtype=torch.int64, device=device)
        self.seconds = torch.zeros((), dtype=torch.float64, device=device)
        self.ticked = False  # host: a step has ended (before that a policy sees no step time)

    def _stamp(self, end: bool) -> None:
        if self.device.type == "cuda":
            from oasis_kernels.step_clock import stamp
        else:
            from oasis_kernels.step_clock import stamp_host as stamp
        stamp(self.ns, end)

    def start(self) -> None:
        self._stamp(False)

    def end(self) -> None:
        self._stamp(True)
        self.seconds.copy_(self.ns[1])  # int64 -> float64, exact below 2**53 ns
        self.seconds.mul_(1e-9)
        self.ticked = True


class DeviceCaps:
    """Per-layer fetch caps from ``policy`` (see the module docstring)."""

    def __init__(
        self,
        *,
        policy: FetchCapPolicy,
        top_k: int,
        n_layers: int,
        bytes_per_block_head: int,
        link_bytes_per_s: float,
        device: torch.device,
        state_rows: int | None = None,
        fetch_layers: int | None = None,
    ):
        self.policy, self.top_k, self.n_layers = policy, top_k, n_layers
        self.fetch_layers = fetch_layers or n_layers  # the layers whose rows share the step's bytes (row_weight)
        self.bytes_per_block_head, self.link_bytes_per_s = bytes_per_block_head, link_bytes_per_s
        self.max_cap = policy.max_cap(top_k)
        self.fixed = None
        if policy.static:
            c = policy.cap(CapContext(step=0, top_k=top_k, rows=0))
            if isinstance(c, Integral):
                self.fixed = min(max(int(c), 0), self.max_cap)
        self.clock = None if self.fixed is not None else StepClock(device=device)
        self.layer_s = None if self.clock is None else torch.zeros(n_layers, dtype=torch.float64, device=device)
        self.steps = 0
        self._like = torch.empty(0, device=device)  # where the policy state lives
        self._row_init, self._layer_init = policy.row_state_init(top_k), policy.layer_state_init(top_k)
        self.row_state = None
        self.layer_state = state_array(self._layer_init, n_layers, like=self._like) if self._layer_init else None
        if self._row_init and state_rows:
            self._grow_rows(state_rows)

    def _grow_rows(self, rows: int) -> None:
        """Row state for at least ``rows`` store rows per layer (host-side allocation; new rows initialised)."""
        have = 0 if self.row_state is None else self.row_state.shape[1]
        if rows <= have:
            return
        fresh = state_array(self._row_init, self.n_layers * (rows - have), like=self._like)
        fresh = fresh.reshape(self.n_layers, rows - have, len(self._row_init))
        self.row_state = fresh if self.row_state is None else torch.cat([self.row_state, fresh], dim=1)

    def reset_rows(self, rows) -> None:
        """A new request in these store rows (a lane's KV heads): their policy state starts afresh, not where the
        lane's previous request left it. Called at admission, outside any captured step."""
        if self.row_state is None:
            return
        init = torch.tensor(self._row_init, dtype=self.row_state.dtype, device=self.row_state.device)
        self.row_state[:, rows] = init

    @property
    def adaptive(self) -> bool:
        return self.clock is not None

    def step_start(self) -> None:
        if self.clock is not None:
            self.clock.start()

    def step_end(self) -> None:
        if self.clock is not None:
            self.clock.end()
        self.steps += 1

    def layer_ready(self, layer: int) -> None:
        """Main stream, after layer ``layer``'s transfer of the previous step was waited for: its step-time copy."""
        if self.clock is not None:
            self.layer_s[layer].copy_(self.clock.seconds)

    def _row_slice(self, layer: int, n: int, rows):
        """The call's row state: a view of rows ``0 .. n-1`` of the layer, or a gathered copy at ``rows``."""
        if rows is None:
            self._grow_rows(n)
            return self.row_state[layer, :n]
        if self.row_state is None:
            raise ValueError("DeviceCaps.cap: rows given but no state_rows to size the row state by")
        return self.row_state[layer].index_select(0, rows)

    def context(self, layer: int, resident, pred, rows=None) -> CapContext:
        """The ``CapContext`` of one layer's plan: resident [R, S] and pred [R, K] of its rows (device tensors);
        rows: their store row ids (int64 device tensor [R]) or None (see the module docstring)."""
        t = self.layer_s[layer] if self.clock is not None and self.clock.ticked else None
        n = pred.shape[0]
        return CapContext(
            step=self.steps,
            top_k=self.top_k,
            rows=pred.shape[0],
            n_missing=count_missing(resident, pred),
            last_step_time_s=t,
            link_bytes_per_s=self.link_bytes_per_s,
            bytes_per_block_head=self.bytes_per_block_head,
            row_weight=float(self.fetch_layers),
            n_predicted=(pred >= 0).sum(dim=1),
            layer=layer,
            layers=self.n_layers,
            row_state=self._row_slice(layer, n, rows) if self._row_init else None,
            layer_state=self.layer_state,
        )

    def cap(self, layer: int, resident, pred, rows=None):
        """This step's cap of the layer's rows: an int, or an int64 tensor [R] on the device. rows: the store row
        ids of those rows (int64 device tensor), or None: see the module docstring."""
        if self.fixed is not None:
            return self.fixed
        ctx = self.context(layer, resident, pred, rows)
        c = self.policy.cap(ctx)
        if rows is not None and ctx.row_state is not None:  # the gathered copy back to the rows' state
            self.row_state[layer].index_copy_(0, rows, ctx.row_state)
        if isinstance(c, Integral):  # a host-side branch of the policy (no step time yet)
            return min(max(int(c), 0), self.max_cap)
        return c.to(torch.int64)
