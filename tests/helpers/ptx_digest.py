"""Did a change to a kernel's source change what the H200 runs? Compile the launches a CPU test session recorded
(``sm90_plugin``) for sm_90 and write a digest of each signature's PTX code (the DWARF sections, ``.loc``/``.file``
lines and debug labels left out), then compare two checkouts' digests.

    OASIS_SM90_OUT=/tmp/l.json PYTHONPATH=tests/helpers:. python -m pytest -q -p sm90_plugin tests/unit/test_kernels_X.py
    ROOT=/path/to/before python tests/helpers/ptx_digest.py /tmp/l.json /tmp/before.json KERNEL[,KERNEL...]
    ROOT=/path/to/after  python tests/helpers/ptx_digest.py /tmp/l.json /tmp/after.json  KERNEL[,KERNEL...]
    cmp /tmp/before.json /tmp/after.json

Equal digests: the same instructions, so the same speed (used for ``oasis_kernels/prologue.py``, 2026-12-05)."""

import hashlib
import json
import os
import re
import sys

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "0"  # before triton decorates anything
    sys.path[:0] = [os.environ.get("ROOT", os.getcwd()), os.path.dirname(os.path.abspath(__file__))]
    import triton
    from sm90_compile import signature
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    seen, out_path, names = json.load(open(sys.argv[1])), sys.argv[2], set(sys.argv[3].split(","))
    out = {}
    for rec in (r for r in seen if r["name"] in names):
        jf, sig, consts = signature(rec)
        key = f"{rec['module']}.{rec['name']} {json.dumps(sorted(sig.items()))} {sorted(map(repr, consts.items()))}"
        if key not in out:
            ptx = triton.compile(ASTSource(jf, sig, consts), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
            code = [
                x for x in ptx.split("\t.section")[0].splitlines() if not re.match(r"\s*(\.loc|\.file|//|\$L__)", x)
            ]
            out[key] = hashlib.sha256("\n".join(code).encode()).hexdigest()[:16]
    json.dump(out, open(out_path, "w"), indent=0, sort_keys=True)
    print(f"{len(out)} signatures of {sorted(names)} -> {out_path}")
