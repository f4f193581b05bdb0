"""The inline transfer path: a layer's copy list applied by plain indexing on the current stream.

What the CPU runs (tests) and the synchronous reference mode on CUDA (host rows indexed on the CPU, then one
copy to the device each for K and V); retrieval mode on CUDA takes the UVA path instead, still on the critical
path (``Prefetcher.fetch_now``). An fp8 host pool is read through ``HostPool.read``: the codes and scales are moved,
then dequantized on the device (``oasis_exec.kv.host_quant.dequantize``).
"""

from __future__ import annotations


def copy_inline(store, host, device, layer, src, head, dst) -> None:
    """Copy the live entries (``src >= 0``) of layer ``layer``'s list: host block ``src``, KV head ``head`` ->
    GPU slot ``dst``, for K and V."""
    live = src >= 0
    s, h, d = src[live].long(), head[live].long(), dst[live].long()
    k, v = host.read(layer, s.cpu(), h.cpu(), device)  # an fp8 pool: codes and scales moved, dequantized there
    store.k[layer][d] = k
    store.v[layer][d] = v
