"""Are Triton's tl.cos / tl.sin exact enough for RoPE at long positions on this GPU? (fused_ops.qk_norm_rope's unit
tests failed compiled on an H100, 2026-12-07: up to 3.8e-4 off torch in fp32 at positions near 2e5.)

    python experiments/rope_trig/check.py [--out FILE.json]

For angles pos * inv_freq (d = 128, theta 1e4 and 1e6, positions 0 .. 200K): the largest |tl.cos - torch.cos| and
|tl.sin - torch.sin| in fp32, against torch on the same GPU and on the CPU, by position range.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import oasis_kernels  # noqa: F401  (before triton)


@triton.jit
def _trig(X, C, S, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(X + offs, mask=m, other=0.0)
    tl.store(C + offs, tl.cos(x), mask=m)
    tl.store(S + offs, tl.sin(x), mask=m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for theta in (1e4, 1e6):
        inv = 1.0 / (theta ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
        for lo, hi in ((0, 8192), (8192, 32768), (32768, 65536), (65536, 131072), (131072, 200000)):
            ang = (torch.arange(lo, hi, dtype=torch.float32)[:, None] * inv).reshape(-1)
            x = ang.to(dev)
            c, s = torch.empty_like(x), torch.empty_like(x)
            _trig[(triton.cdiv(x.numel(), 1024),)](x, c, s, x.numel(), BLOCK=1024)
            row = {"theta": theta, "positions": [lo, hi], "max_angle": float(ang.max())}
            for name, ref in (("gpu_torch", x), ("cpu_torch", ang)):
                row[name] = {
                    "cos": float((c.cpu() - ref.cos().cpu()).abs().max()),
                    "sin": float((s.cpu() - ref.sin().cpu()).abs().max()),
                }
            rows.append(row)
            print(json.dumps(row))
    if a.out:
        json.dump({"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "triton": triton.__version__,
                   "rows": rows}, open(a.out, "w"), indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
