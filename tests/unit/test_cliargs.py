"""oasis_core.cliargs: options generated from a dataclass, the dataclass built back from what was given."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from oasis_core import cliargs


def _h(help, default, **meta):
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class Demo:
    name: str = _h("a name", "x")
    count: int = _h("how many", 3)
    ratio: float = _h("a share", 0.5)
    limit: int | None = _h("at most this many", None)
    budget: float | None = _h("GB", None)
    fast: bool = _h("go fast", True)
    loud: bool = _h("say more", False)
    no_copy: bool = _h("skip the copies", False)
    kind: str = _h("one of a | b", "a", choices=("a", "b"))
    extra: Mapping[str, Any] = _h("overrides", None)
    path: str | None = _h("a file", None, metavar="FILE")

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"Demo.count: must be >= 1, got {self.count}")
        if self.ratio > 1:
            raise ValueError(f"ratio: must be <= 1, got {self.ratio}")


def _parser(**kw):
    p = cliargs.OneLineParser(prog="demo")
    cliargs.add_options(p, Demo, **kw)
    return p


def test_only_given_options_reach_the_dataclass_so_its_defaults_are_the_defaults():
    p = _parser()
    assert cliargs.values(p.parse_args([]), Demo) == {}
    assert cliargs.build(Demo, p.parse_args([])) == Demo()
    ns = p.parse_args(
        [
            "--count",
            "7",
            "--limit",
            "2",
            "--budget",
            "1.5",
            "--no-fast",
            "--loud",
            "--no-copy",
            "--kind",
            "b",
            "--extra",
            '{"k": [1, 2]}',
            "--name",
            "y",
            "--path",
            "f.txt",
        ]
    )
    assert cliargs.values(ns, Demo) == {
        "count": 7,
        "limit": 2,
        "budget": 1.5,
        "fast": False,
        "loud": True,
        "no_copy": True,
        "kind": "b",
        "extra": {"k": [1, 2]},
        "name": "y",
        "path": "f.txt",
    }
    assert cliargs.build(Demo, p.parse_args(["--fast"])).fast is True
    assert cliargs.build(Demo, p.parse_args(["--count", "4"]), count=9).count == 9  # fixed fields win


def test_help_shows_the_dataclass_defaults_and_metavars():
    text = _parser().format_help()
    assert "how many (default: 3)" in text and "--fast, --no-fast" in text and "(default: on)" in text
    assert "--no-copy" in text and "--no-no-copy" not in text
    assert "--path FILE" in text and "--count INT" in text and "{a,b}" in text and "--extra JSON" in text


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--count", "1e3"], ["--count", "must be an integer", "'1e3'"]),
        (["--ratio", "nan"], ["--ratio", "must be finite"]),
        (["--ratio", "x"], ["--ratio", "must be a number"]),
        (["--kind", "c"], ["--kind", "invalid choice", "'c'"]),
        (["--extra", "[1]"], ["--extra", "JSON object"]),
        (["--extra", "{bad"], ["--extra", "not JSON"]),
        (["--bogus"], ["unrecognized", "--bogus"]),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("demo: error: ")
    for w in words:
        assert w in err


def test_validation_errors_name_the_option_not_the_field():
    p = _parser()
    with pytest.raises(cliargs.CliError, match=r"^--count: must be >= 1, got 0$"):
        cliargs.build(Demo, p.parse_args(["--count", "0"]))
    with pytest.raises(cliargs.CliError, match=r"^--ratio: must be <= 1, got 2.0$"):
        cliargs.build(Demo, p.parse_args(["--ratio", "2"]))
    with pytest.raises(cliargs.CliError, match=r"^Demo.count: must be >= 1"):  # set by the caller: no option to name
        cliargs.build(Demo, p.parse_args([]), count=0)


def test_prefix_exclude_and_help_overrides():
    p = argparse.ArgumentParser()
    cliargs.add_options(p, Demo, exclude={"extra", "path"}, prefix="demo-", dest_prefix="demo_", helps={"name": "who"})
    ns = p.parse_args(["--demo-count", "5", "--no-demo-fast"])
    assert cliargs.values(ns, Demo, exclude={"extra", "path"}, dest_prefix="demo_") == {"count": 5, "fast": False}
    assert "--demo-extra" not in p.format_help() and "who (default: x)" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--extra", "{}"])
    with pytest.raises(TypeError, match="no field"):
        cliargs.add_options(argparse.ArgumentParser(), Demo, exclude={"nope"})


def test_required_fields_and_unsupported_types():
    @dataclass
    class Need:
        n: int = field(metadata={"help": "required"})

    p = cliargs.OneLineParser(prog="need")
    cliargs.add_options(p, Need)
    assert cliargs.build(Need, p.parse_args(["--n", "2"])) == Need(2)

    @dataclass
    class Odd:
        xs: list = field(default_factory=list)

    with pytest.raises(TypeError, match="Odd.xs"):
        cliargs.add_options(argparse.ArgumentParser(), Odd)


def test_the_simulators_run_options_are_generated():
    """oasis_sim's run options are exactly the ones cliargs generates from SimConfig's fields and the synthetic
    parameters (prefix syn-), besides its own --config, --out, --quiet and --syn-preset; and oasis_sim's
    ``config_from_args`` builds the config the generated options give."""
    from oasis_core.synthetic import SyntheticParams
    from oasis_sim.cli import build_parser, config_from_args
    from oasis_sim.config import SimConfig, make_config

    sim_run = build_parser()._subparsers._group_actions[0].choices["run"]
    theirs = {s for a in sim_run._actions for s in a.option_strings} - {
        "-h",
        "--help",
        "--config",
        "--out",
        "--quiet",
        "--syn-preset",
    }
    p = cliargs.OneLineParser(prog="run")
    cliargs.add_options(p, SimConfig, exclude={"synthetic"})
    cliargs.add_options(p, SyntheticParams, prefix="syn-", dest_prefix="syn_")
    ours = {s for a in p._actions for s in a.option_strings} - {"-h", "--help"}
    assert theirs == ours

    argv = [
        "--model",
        "qwen3-32b",
        "--top-k",
        "64",
        "--concurrency",
        "4",
        "--prefix-cache",
        "--syn-drift-rate",
        "0.2",
        "--fetch-policy",
        "unlimited",
    ]
    ns = p.parse_args(argv)
    syn = cliargs.values(ns, SyntheticParams, dest_prefix="syn_")
    ours_cfg = make_config({**cliargs.values(ns, SimConfig, exclude={"synthetic"}), "synthetic": syn})
    assert ours_cfg == config_from_args(build_parser().parse_args(["run", *argv]))
