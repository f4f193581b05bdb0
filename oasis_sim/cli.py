"""``python -m oasis_sim run|import|sweep|replay|validate`` (console script ``oasis-sim``).

- ``run [TRACE] [--model ..] [--mode ..] ... [--config FILE.yaml] [--out DIR]``: every ``SimConfig`` field is an
  option (``--top-k``, ``--fetch-ratio``, ...; booleans as ``--prefix-cache``), every synthetic-selection parameter
  ``--syn-<name>``. No TRACE: the bundled Mooncake slice. Prints a summary table; writes ``DIR/summary.json``,
  ``DIR/requests.csv``, ``DIR/steps.csv``, ``DIR/memory.csv``, ``DIR/timeline.json`` (byte-identical for the same
  inputs and seed) and ``DIR/timing.json`` (wall-clock time and speed; differs run to run).
- ``import mooncake|azure SRC -o OUT [--limit N] [--time-scale X] [--model NAME] [--max-context N]
  [--overflow clip|drop] [--seed N] [--spread auto|uniform|even|none]``: ``oasis_core.importers``' options.
- ``sweep GRID.yaml --out DIR [--workers N] [--ray local|ADDRESS]``: see ``oasis_sim.sweep`` and docs/sweeps.md.
- ``replay RECORDING [--out DIR]`` and ``validate RECORDING... [--calibrate-from RECORDING...] [--out DIR]``:
  executor recordings in the simulator, see ``oasis_sim.replay`` and ``oasis_sim.validate``.

Any malformed trace, config or option exits with status 2 and one line on stderr naming the file, the record or
option, the field and the bad value — never a traceback; so do sizes that cannot be held in memory
(``oasis_sim.limits``) and an ``--out`` that cannot be written (checked before the work). ``run`` adds the
configuration and the trace's path and sha256 to ``summary.json`` (``metrics.provenance``). A closed stdout
(``... | head``) ends the command quietly with status 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import typing
from dataclasses import fields
from typing import Optional, Sequence

from oasis_core.importers import UsageError as ImportUsageError
from oasis_core.synthetic import SyntheticParams, param_help
from oasis_core.trace import TraceError

from .config import ConfigError, SimConfig, config_fields, make_config

EXIT_BAD_INPUT = 2



def _field_type(hint) -> type:
    """int, float, bool or str: a SimConfig field's annotation without its Optional."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(" ".join(message.split()))


def _number(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        return v

    parse.__name__ = kind.__name__
    return parse


def _add_config_options(p: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(SimConfig)
    for name, (default, help_) in config_fields().items():
        if name == "synthetic":
            continue
        flag = "--" + name.replace("_", "-")
        kind = _field_type(hints[name])
        if kind is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
            continue
        typ = _number(kind) if kind in (int, float) else str
        p.add_argument(flag, dest=name, type=typ, default=None, metavar=kind.__name__.upper(),
                       help=f"{help_} (default {default})")
    from oasis_core.synthetic_presets import PRESETS

    p.add_argument("--syn-preset", dest="syn_preset", choices=sorted(PRESETS), default=None,
                   help="synthetic selection: the named parameter set the --syn-* options override (default paper)")
    for name, help_ in param_help().items():
        kind = type(getattr(SyntheticParams(), name))
        p.add_argument("--syn-" + name.replace("_", "-"), dest="syn_" + name, type=_number(kind), default=None,
                       help=f"synthetic selection: {help_}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oasis-sim", description="OasisKV SimPy simulator")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="simulate a trace")
    run.add_argument("trace", nargs="?", default=None, help="trace file (default: the bundled Mooncake slice)")
    run.add_argument("--config", default=None, help="YAML/JSON file of SimConfig fields (options override it)")
    run.add_argument("--out", default="out/run", help="output directory")
    run.add_argument("--quiet", action="store_true", help="no summary table")
    _add_config_options(run)
    from oasis_core.importers import add_import_arguments

    imp = sub.add_parser("import", help="convert a public trace to the OasisKV trace format (traces/SCHEMA.md)")
    add_import_arguments(imp)
    sw = sub.add_parser("sweep", help="run the cartesian product of a parameter grid")
    sw.add_argument("grid")
    sw.add_argument("--out", required=True)
    sw.add_argument("--workers", type=_number(int), default=None,
                    help="local processes, or the CPUs of the local Ray instance of --ray local (default: all)")
    sw.add_argument("--ray", dest="ray", metavar="ADDRESS", default=None,
                    help="run the points as Ray tasks: 'local' starts a local Ray instance, else the address of a "
                         "running cluster ('auto', HOST:PORT, ray://HOST:PORT); needs the 'sweep' extra")
    from .validate import add_subcommands

    add_subcommands(sub)
    return p


def load_config_file(path: str) -> dict:
    import yaml

    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or type(e).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: invalid YAML{where}: {getattr(e, 'problem', None) or 'syntax error'}") from None
    if obj is None:
        raise ConfigError(f"{path}: empty file")
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: top level: must be a mapping of SimConfig fields, got {type(obj).__name__}")
    return obj


def config_from_args(args) -> SimConfig:
    values = {}
    if args.config:
        values.update(load_config_file(args.config))
        source = args.config
        try:
            make_config(values)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    syn = dict(values.get("synthetic") or {})
    for f in fields(SimConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    for name in param_help():
        v = getattr(args, "syn_" + name)
        if v is not None:
            syn[name] = v
    if getattr(args, "syn_preset", None):
        syn["preset"] = args.syn_preset
    if syn:
        values["synthetic"] = syn
    try:
        return make_config(values)
    except ConfigError as e:
        name, _, rest = str(e).partition(":")
        flag = "--" + name.replace("_", "-")
        if name == "synthetic":  # "synthetic: SyntheticParams.<field>: ..." -> --syn-<field>
            inner, _, rest2 = rest.strip().partition(":")
            if inner.startswith("SyntheticParams."):
                flag, rest = "--syn-" + inner.split(".", 1)[1].replace("_", "-"), rest2
        raise ConfigError(f"options: {flag}:{rest}") from None


def _fmt_bytes(b) -> str:
    return "-" if b is None else f"{b / 1e9:.3f} GB"


def summary_table(s: dict, wall_s: float) -> str:
    def f(v, nd=2):
        return "-" if v is None else f"{v:,.{nd}f}"

    speed = s["simulated_s"] / wall_s if wall_s > 0 else float("inf")
    rows = [
        ("mode / model / hardware", f"{s['mode']} / {s['model']} / {s['hardware']} (split {s['split']})"),
        ("requests completed", f"{s['requests_completed']} of {s['requests']} ({s['requests_rejected']} rejected, "
                               f"{s['preemptions']} preemptions)"),
        ("throughput", f"{f(s['throughput_tok_s'], 1)} tok/s"),
        ("TPOT p50 / p99", f"{f(s['tpot_ms_p50'])} / {f(s['tpot_ms_p99'])} ms"),
        ("TTFT p50 / p99", f"{f(s['ttft_ms_p50'], 1)} / {f(s['ttft_ms_p99'], 1)} ms"),
        ("host->GPU / network", f"{_fmt_bytes(s['h2d_bytes'])} / {_fmt_bytes(s['net_bytes'])}"),
        ("HBM / host peak", f"{_fmt_bytes(s['hbm_peak_bytes'])} / {_fmt_bytes(s['host_peak_bytes'])}"),
        ("resident recall", f(s["resident_recall"], 4)),
        ("stall total", f"{f(s['stall_ms_total'], 1)} ms"),
        ("simulated / wall", f"{f(s['simulated_s'])} s / {wall_s:.2f} s ({speed:,.0f}x real time)"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def prepare_out_dir(out_dir: str) -> None:
    """Create ``out_dir`` (a folder) before any work, so a bad ``--out`` costs one line, not a finished run."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out {out_dir}: exists and is not a folder")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: cannot create: {e.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out_dir}: not writable")


def write_outputs(result, out_dir: str) -> None:
    prepare_out_dir(out_dir)
    for name, text in result.files().items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    sim_s = result.summary["simulated_s"]
    timing = {"wall_s": round(result.wall_s, 4), "simulated_s": sim_s, "steps": result.events,
              "speedup_x": round(sim_s / result.wall_s, 2) if result.wall_s > 0 else None,
              "steps_per_wall_s": round(result.events / result.wall_s, 1) if result.wall_s > 0 else None}
    with open(os.path.join(out_dir, "timing.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(timing, indent=2, sort_keys=True) + "\n")


def cmd_run(args) -> int:
    from .sim import simulate
    from .workloads import load_workload

    from .metrics import provenance
    from .workloads import bundled_trace_path

    cfg = config_from_args(args)
    prepare_out_dir(args.out)
    trace = load_workload(args.trace)
    result = simulate(cfg, trace)
    result.summary.update(provenance(cfg, args.trace or bundled_trace_path()))
    write_outputs(result, args.out)
    s = result.summary
    if s["requests_rejected"]:
        from oasis_core.scheduler import REJECT_REASONS

        why = ", ".join(f"{s['rejected_' + r]} {r}" for r in REJECT_REASONS if s["rejected_" + r])
        print(f"oasis-sim: {s['requests_rejected']} of {s['requests']} requests rejected ({why}): they can never "
              f"be admitted", file=sys.stderr)
    if not args.quiet:
        print(summary_table(result.summary, result.wall_s))
        print(f"wrote {args.out}/summary.json, requests.csv, steps.csv, memory.csv, timeline.json, timing.json")
    return 0


def cmd_import(args) -> int:
    from oasis_core.importers import import_from_args

    trace = import_from_args(args)
    print(f"wrote {args.out}: {len(trace.requests)} requests over {trace.duration_s:.1f} s")
    return 0


def cmd_sweep(args) -> int:
    from .sweep import run_sweep

    run_sweep(args.grid, args.out, workers=args.workers, ray_address=args.ray)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        from .validate import cmd_replay, cmd_validate

        rc = {"run": cmd_run, "import": cmd_import, "sweep": cmd_sweep, "replay": cmd_replay,
              "validate": cmd_validate}[args.cmd](args)
        sys.stdout.flush()  # a closed stdout fails here, inside the handler below, not at interpreter exit
        return rc
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (UsageError, ImportUsageError, ConfigError, TraceError) as e:
        print(f"oasis-sim: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`... | head`): not an error of the run
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0
