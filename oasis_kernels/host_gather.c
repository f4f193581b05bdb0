/* The host path's CPU gather as one GIL-free call (oasis_kernels/host_native.py builds and loads it).
 *
 * One layer's copy list, as the pipeline hands it to the worker in pinned memory: flat[i] is the row
 * (block * Hkv + head) of the [n_pool_rows, row_bytes] view of the host pool, -1 for a padding entry; dst[i] is the
 * GPU slot it goes to. The live entries are compacted in order: their K and V rows are copied into stage_k/v[0..m),
 * their slots into dst_out[0..m), and dst_out[m..cap) is set to -1 (the scatter kernel's end marker).
 *
 * Returns m, or -(i + 1) when flat[i] is out of range (nothing copied), or -(n + 1) when m would exceed cap.
 * The row copies run on n_threads OpenMP threads (serially when built without OpenMP).
 */
#include <stdint.h>
#include <string.h>

int64_t oasis_gather_rows(const char *pool_k, const char *pool_v, int64_t row_bytes, int64_t n_pool_rows,
                          const int32_t *flat, const int32_t *dst, int64_t n, char *stage_k, char *stage_v,
                          int32_t *dst_out, int64_t cap, int32_t *rows, int n_threads)
{
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t r = flat[i];
        if (r < 0)
            continue;
        if (r >= n_pool_rows)
            return -(i + 1);
        if (m >= cap)
            return -(n + 1);
        rows[m] = r;
        dst_out[m] = dst[i];
        m++;
    }
    for (int64_t j = m; j < cap; j++)
        dst_out[j] = -1;
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t j = 0; j < m; j++) {
        int64_t off = (int64_t)rows[j] * row_bytes;
        memcpy(stage_k + j * row_bytes, pool_k + off, (size_t)row_bytes);
        memcpy(stage_v + j * row_bytes, pool_v + off, (size_t)row_bytes);
    }
    return m;
}

int oasis_gather_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
