"""A poisoned slot pool and a random copy list (with -1 padding) for the gather kernels' tests."""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_pool(n_host, Hkv, BS, D, n_slots, seed, pin=False):
    g = torch.Generator().manual_seed(seed)
    host_k = torch.randn(n_host, Hkv, BS, D, generator=g).to(torch.bfloat16)
    host_v = torch.randn(n_host, Hkv, BS, D, generator=g).to(torch.bfloat16)
    if pin:
        host_k, host_v = host_k.pin_memory(), host_v.pin_memory()
    k_slots = torch.full((n_slots, BS, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    return host_k, host_v, k_slots, k_slots.clone()


def random_list(C, n_host, Hkv, n_slots, g):
    src_block = torch.randint(0, n_host, (C,), generator=g, dtype=torch.int32)
    src_head = torch.randint(0, Hkv, (C,), generator=g, dtype=torch.int32)
    dst = torch.randperm(n_slots, generator=g)[:C].to(torch.int32)
    src_block[2] = -1
    dst[5] = -1
    return src_block, src_head, dst
