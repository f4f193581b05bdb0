"""What the executor's two recorders share (bench results: ``oasis_exec.tools.recorder``; a serving run:
``oasis_exec.server.recording``): the hardware preset of a device name, the sampled step durations, a config as a
dict and the transfer path's name in a recording. stdlib only."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Optional

from .recording import SAMPLED_STEPS_MAX

# executor transfer path -> the simulator's / recording's name
TRANSFER_NAMES = {"host": "dma", "uva": "uva", "auto": "uva"}  # "auto" runs the UVA gather (workingset/prefetcher.py)
# substrings of torch.cuda.get_device_name() -> oasis_core.specs hardware preset
DEVICE_PRESETS = (("H200", "h200"), ("H100", "h100-sxm"))


def hardware_preset(device: str) -> Optional[str]:
    """The ``oasis_core.specs`` hardware preset of a CUDA device name (H200 -> ``h200``), None when unknown."""
    for key, preset in DEVICE_PRESETS:
        if key.lower() in (device or "").lower():
            return preset
    return None


def hardware_of(caller: str, hardware: Optional[str], device: str) -> str:
    """``hardware`` if given, else the preset of ``device``; ``ValueError`` naming ``caller`` when neither tells."""
    hw = hardware or hardware_preset(device)
    if hw is None:
        raise ValueError(f"{caller}: hardware: cannot tell the preset from device {device!r}; pass hardware=")
    return hw


def sample_steps(step_ms, most: int = SAMPLED_STEPS_MAX) -> list:
    """At most ``most`` evenly spaced entries ``{"step": i, "duration_s": s}`` of the per-step durations (ms),
    always including the slowest step so the recorded p99 stays visible."""
    n = len(step_ms)
    if n == 0:
        return []
    if n <= most:
        idx = list(range(n))
    else:
        idx = sorted(
            {round(j * (n - 1) / (most - 2)) for j in range(most - 1)} | {max(range(n), key=lambda i: step_ms[i])}
        )
    return [{"step": i, "duration_s": round(step_ms[i] / 1e3, 9)} for i in idx]


def config_fields(cfg) -> dict:
    """A config (a dataclass, a mapping or None) as a plain dict."""
    if cfg is None:
        return {}
    if is_dataclass(cfg):
        return asdict(cfg)
    return dict(cfg)
