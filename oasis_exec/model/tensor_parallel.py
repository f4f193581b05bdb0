"""Tensor parallelism (``ExecConfig.tensor_parallel``): one process a rank, each holding a share of the heads and of
the MLP, through ``torch.distributed`` (NCCL on GPUs, with NVLink multicast off: ``NCCL_NVLS_ENABLE=0``; gloo on the
CPU).

The split (Megatron-style, per decoder layer):

- attention: the KV heads are cut into contiguous runs, one a rank, and each rank takes the query heads of its KV
  heads (q/k/v column-parallel, o row-parallel). The cut may be uneven: ``head_split(3, 2)`` gives rank 0 KV heads
  0-1 (query heads 0-5 of SmolLM2's 9) and rank 1 KV head 2 (query heads 6-8); GQA groups never straddle ranks;
- MLP: the intermediate dimension cut the same way (gate/up column-parallel, down row-parallel);
- one all-reduce (sum) after the attention's output projection and one after the MLP's down projection
  (``Decoder.finish``); norms, the embedding and the LM head are replicated (every rank computes the same logits
  from the same all-reduced residual, so every rank samples the same tokens with the same per-request keys and no
  token is broadcast); the draft head is replicated too (it reads the replicated residual).

Every rank builds its own engine from the same ``ExecConfig`` and the same requests, so the scheduler decides the
same on every rank. What a rank owns is sized by its local shape (``Decoder.shape``: its heads and MLP share, the
full model's ``Decoder.full_shape``): its GPU working set, its block summaries, its per-head maps, its prefetch
pipeline and its share of the host pool (the KV heads it owns). A synthetic selection is drawn per rank for its own
KV heads (the same generator and seed on each rank, so it is not the TP=1 run's draw for those heads).

``launch(fn, size, *args)`` runs ``fn(*args)`` on ``size`` ranks: inside ``torchrun`` (``WORLD_SIZE`` set) in this
process, else in ``size`` processes spawned here (``torch.multiprocessing``), and returns rank 0's result.
"""

from __future__ import annotations

import dataclasses
import os
import socket

import torch

from oasis_core.specs import head_split, tp_local


@dataclasses.dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group: ``size`` ranks, this one ``rank``."""

    size: int
    rank: int

    def all_reduce(self, x):
        """Sum ``x`` over the ranks in place (identity with one rank); returns it."""
        if self.size > 1:
            torch.distributed.all_reduce(x)
        return x

    def kv_heads(self, shape) -> tuple:
        """(first, end) KV heads of this rank in the full model ``shape``."""
        return head_split(shape.n_kv_heads, self.size)[self.rank]

    def shard(self, shape, weights: dict) -> tuple:
        """(local shape, local weights) of this rank: the full model's Hugging Face-named ``weights`` sliced (q/k/v
        and gate/up rows, o and down columns); the rest shared. The local shape has this rank's heads and MLP
        columns; hidden, vocabulary and everything else are the model's."""
        g, d = shape.gqa_group, shape.head_dim
        k0, k1 = self.kv_heads(shape)
        q0, q1 = k0 * g, k1 * g
        m0, m1 = head_split(shape.mlp_hidden, self.size)[self.rank]
        cols = {
            "q_proj": (q0 * d, q1 * d, 0),
            "k_proj": (k0 * d, k1 * d, 0),
            "v_proj": (k0 * d, k1 * d, 0),
            "o_proj": (q0 * d, q1 * d, 1),
            "gate_proj": (m0, m1, 0),
            "up_proj": (m0, m1, 0),
            "down_proj": (m0, m1, 1),
        }
        out = {}
        for name, w in weights.items():
            part = name.split(".")[-2] if name.startswith("model.layers.") else None
            if part in cols:
                lo, hi, dim = cols[part]
                w = w.narrow(dim, lo, hi - lo).contiguous()
            out[name] = w
        return tp_local(shape, self.size, self.rank), out


def group(size: int) -> TPGroup | None:
    """The group of a run with ``tensor_parallel = size``: None for 1; else this process's rank in the initialised
    default process group (RuntimeError when there is none, or it has another size)."""
    if size == 1:
        return None
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"tensor_parallel={size} needs torch.distributed initialised: run through oasis_exec.model.tensor_parallel."
            "launch (bench --tensor-parallel N does) or torchrun"
        )
    if dist.get_world_size() != size:
        raise RuntimeError(f"tensor_parallel={size}, but the process group has {dist.get_world_size()} ranks")
    return TPGroup(size=size, rank=dist.get_rank())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(backend: str) -> None:
    """Initialise the default process group from the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU under NCCL)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (withheld / unstable on the lent hosts)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    torch.distributed.init_process_group(backend=backend)
    if backend == "nccl":  # the communicator made now, eagerly: not lazily inside a CUDA-graph capture of a step
        torch.distributed.all_reduce(torch.zeros(1, device="cuda"))
        torch.cuda.synchronize()


def _worker(rank, size, port, backend, fn, args, out_dir):
    import pickle

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    init(backend)
    try:
        out = fn(*args)
    finally:
        torch.distributed.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as fh:  # a file: a pipe would block a large result
        pickle.dump(out, fh)


def launch(fn, size: int, *args, backend: str = "gloo", every_rank: bool = False):
    """Run ``fn(*args)`` on ``size`` ranks and return rank 0's result (``every_rank``: the list of every rank's, in
    rank order): in this process when it already is a rank (an initialised group, or torchrun's ``WORLD_SIZE``:
    then its own result only), else in ``size`` spawned processes (``fn`` must then be importable: a module-level
    function). ``backend``: gloo (CPU) or nccl (one GPU a rank)."""
    dist = torch.distributed
    if dist.is_initialized():
        return fn(*args)
    if int(os.environ.get("WORLD_SIZE", "1")) == size and size > 1:  # torchrun
        init(backend)
        try:
            return fn(*args)
        finally:
            dist.destroy_process_group()
    import pickle
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            _worker, args=(size, _free_port(), backend, fn, args, d), nprocs=size, join=True, start_method="spawn"
        )
        outs = []
        for r in range(size):
            with open(os.path.join(d, f"rank{r}.pkl"), "rb") as fh:
                outs.append(pickle.load(fh))
    return outs if every_rank else outs[0]
