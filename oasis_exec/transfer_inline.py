"""The inline transfer path: a layer's copy list applied by plain indexing on the current stream.

What the CPU runs (tests) and the synchronous reference mode on CUDA (host rows indexed on the CPU, then one
copy to the device each for K and V); retrieval mode on CUDA takes the UVA path instead, still on the critical
path (``Prefetcher.fetch_now``).
"""

from __future__ import annotations


def copy_inline(store, host, device, layer, src, head, dst) -> None:
    """Copy the live entries (``src >= 0``) of layer ``layer``'s list: host block ``src``, KV head ``head`` ->
    GPU slot ``dst``, for K and V."""
    live = src >= 0
    s, h, d = src[live].long(), head[live].long(), dst[live].long()
    hk, hv = host.k[layer], host.v[layer]
    if device.type == "cuda":
        s, h = s.cpu(), h.cpu()
        store.k[layer][d] = hk[s, h].to(device, non_blocking=True)
        store.v[layer][d] = hv[s, h].to(device, non_blocking=True)
    else:
        store.k[layer][d] = hk[s, h]
        store.v[layer][d] = hv[s, h]
