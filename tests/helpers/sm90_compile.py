"""Compile, on a machine without a GPU, every Triton kernel a CPU test launched, for the H200 (sm_90).

The CPU tests run the kernels under Triton's interpreter, which accepts programs the compiler refuses (on
2026-12-01 the fp8 dequantization passed every interpreted test and failed to compile on the H200: two returns of
different types). Triton's compiler itself needs no GPU: ``triton.compile`` with a ``GPUTarget`` runs the frontend,
the MLIR passes and the bundled ``ptxas``. So:

    with record_launches() as seen:     # patches the interpreter's launch to note each kernel and its argument types
        ...run CPU code that launches kernels...
    failures = compile_sm90(seen)       # {kernel: error} for every (kernel, signature, constexprs) seen

``compile_sm90`` compiles in a subprocess with ``TRITON_INTERPRET=0`` (``triton.jit`` reads it when a function is
decorated, and this process decorated its kernels for the interpreter).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys

LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid"}
TORCH_TO_TRITON = {
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float32": "fp32",
    "torch.float64": "fp64",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.int16": "i16",
    "torch.uint16": "u16",
    "torch.int32": "i32",
    "torch.uint32": "u32",
    "torch.int64": "i64",
    "torch.bool": "i1",
    "torch.float8_e4m3fn": "fp8e4nv",
    "torch.float8_e5m2": "fp8e5",
}


def _describe(v):
    """A JSON description of one launch argument: a pointer's element type or a scalar's value."""
    if hasattr(v, "data_ptr") and hasattr(v, "dtype"):
        return {"ptr": TORCH_TO_TRITON[str(v.dtype)]}
    if type(v).__name__ == "TensorDescriptor":  # TMA: triton.tools.tensor_descriptor
        return {"desc": TORCH_TO_TRITON[str(v.base.dtype)], "block": list(v.block_shape)}
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v}
    name = getattr(v, "name", None)  # a tl.dtype passed as a constexpr
    if isinstance(name, str):
        return {"dtype": name}
    inner = getattr(v, "value", None)  # tl.constexpr(...)
    if inner is not None:
        return _describe(inner)
    raise TypeError(f"sm90_compile: cannot describe a launch argument of type {type(v).__name__}")


@contextlib.contextmanager
def record_launches():
    """Note every interpreted kernel launch: yields a list of {"module", "name", "args": {param: description}}."""
    from triton.runtime.interpreter import InterpretedFunction

    seen, keys = [], set()
    run = InterpretedFunction.run

    def noting(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        bound = inspect.signature(fn).bind_partial(
            *args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        )
        bound.apply_defaults()
        desc = {k: _describe(v) for k, v in bound.arguments.items()}
        rec = {"module": fn.__module__, "name": fn.__name__, "args": desc}
        key = json.dumps(rec, sort_keys=True)
        if key not in keys:
            keys.add(key)
            seen.append(rec)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = noting
    try:
        yield seen
    finally:
        InterpretedFunction.run = run


def signature(rec: dict):
    """A recorded launch as what ``triton.compile`` takes: (the JITFunction, its signature, its constexprs)."""
    import importlib

    import triton.language as tl

    jf = getattr(importlib.import_module(rec["module"]), rec["name"])
    while not hasattr(jf, "params"):  # an Autotuner / Heuristics wraps the JITFunction
        jf = jf.fn
    sig, consts = {}, {}
    for i, p in enumerate(jf.params):
        d = rec["args"][p.name]
        if p.is_constexpr or "none" in d or "dtype" in d:
            sig[p.name] = "constexpr"
            value = next(iter(d.values())) if "none" not in d else None
            consts[(i,)] = getattr(tl, value) if "dtype" in d else value
        elif "ptr" in d:
            sig[p.name] = "*" + d["ptr"]
        elif "desc" in d:
            sig[p.name] = f"tensordesc<{d['desc']}[{', '.join(map(str, d['block']))}]>"
        elif "bool" in d:
            sig[p.name] = "i1"
        elif "int" in d:
            sig[p.name] = "i32" if -(2**31) <= d["int"] < 2**31 else "i64"
        else:
            sig[p.name] = "fp32"
    return jf, sig, consts


def _compile_one(rec: dict, done: set) -> bool:
    """Compile one recorded launch for sm_90 (in the subprocess), unless its signature was compiled already (``done``:
    launches differing only in the values of non-constexpr integers compile alike). True if it compiled now."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jf, sig, consts = signature(rec)
    key = (rec["module"], rec["name"], tuple(sig.items()), tuple(sorted((k, repr(v)) for k, v in consts.items())))
    if key in done:
        return False
    done.add(key)
    triton.compile(ASTSource(jf, sig, consts), target=GPUTarget("cuda", 90, 32))
    return True


def compile_sm90(seen: list, timeout_s: float = 600) -> tuple:
    """Compile every recorded launch for sm_90 in one subprocess; returns (signatures compiled,
    {"module.name(#i)": error} of the launches that failed: the root cause, then the compiler's message)."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    code = (
        "import json, sys, traceback\n"
        "sys.path[:0] = json.loads(sys.argv[1])\n"
        "from sm90_compile import _compile_one\n"
        "out, done, n = {}, set(), 0\n"
        "for i, rec in enumerate(json.load(sys.stdin)):\n"
        "    try:\n"
        "        n += _compile_one(rec, done)\n"
        "    except Exception as e:\n"
        "        cause = e\n"
        "        while (cause.__cause__ or cause.__context__) is not None:\n"
        "            cause = cause.__cause__ or cause.__context__\n"
        "        why = f'{type(cause).__name__}: {cause}' if cause is not e else ''\n"
        "        out[f\"{rec['module']}.{rec['name']}(#{i})\"] = why[:500] + ' | ' + (type(e).__name__ + ': ' + str(e))[-1000:]\n"
        "print(json.dumps({'failed': out, 'compiled': n}))\n"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    p = subprocess.run(
        [sys.executable, "-c", code, json.dumps([here, root])],
        input=json.dumps(seen),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        cwd=root,
    )
    if p.returncode != 0:
        raise RuntimeError(f"sm90_compile: the compiling process failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res["compiled"], res["failed"]
