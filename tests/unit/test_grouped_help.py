"""Issue 35, newcomer: ``oasis-sim run --help`` and ``python -m oasis_exec bench --help`` show what most runs set
first and the tuning under headings, and no help text quotes H200 measurements (docs/exec_tuning.md holds them)."""

import argparse
import dataclasses
import re

import pytest

from oasis_core import cliargs


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def _headings(text: str) -> list[str]:
    return [line[:-1] for line in text.splitlines() if re.fullmatch(r"[a-z][^ ].*:", line)]


def test_add_options_groups_fields_in_the_order_given():
    @dataclasses.dataclass
    class C:
        a: int = 1
        b: int = 2
        c: int = 3

    p = argparse.ArgumentParser(prog="x")
    cliargs.add_options(p, C, groups=(("first", ("c",)), ("then", ("a",))))
    text = p.format_help()
    assert _headings(text) == ["options", "first", "then", "other options"]
    body = text.split("\n\n", 1)[1]  # after the usage line
    assert body.index("--c") < body.index("--a") < body.index("--b")


def test_sim_run_help_is_grouped(capsys):
    from oasis_sim.cli import build_parser

    out = _help(lambda a: build_parser().parse_args(a), ["run", "--help"], capsys)
    heads = _headings(out)
    assert heads[:3] == ["positional arguments", "options", "what most runs set"], heads
    assert "other options" not in heads  # every SimConfig field has its heading
    first = out.split("what most runs set:")[1].split("\n\n")[0]
    for flag in ("--model", "--mode", "--hardware", "--concurrency", "--max-requests"):
        assert flag in first
    assert out.splitlines()[0] == "usage: oasis-sim run [TRACE] [options] (--help: the options by subject)"


@pytest.mark.parametrize("cmd", ["bench", "generate"])
def test_exec_help_is_grouped_and_free_of_measurements(capsys, cmd):
    from oasis_exec.__main__ import build_parser

    out = _help(lambda a: build_parser().parse_args(a), [cmd, "--help"], capsys)
    heads = _headings(out)
    assert "what most runs set" in heads and "transfers (tuning)" in heads and "engine: other options" not in heads
    assert "H200" not in out and "measured on" not in out


def test_no_help_text_quotes_h200_figures(capsys):
    from oasis_exec.server.cli import build_parser as serve_parser
    from oasis_sim.cli import build_parser as sim_parser

    for build, argv in ((sim_parser, ["run", "--help"]), (serve_parser, ["--help"])):
        out = _help(lambda a, b=build: b().parse_args(a), argv, capsys)
        assert "H200" not in out, argv
