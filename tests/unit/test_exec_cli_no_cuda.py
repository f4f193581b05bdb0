"""``python -m oasis_exec bench`` (or ``generate``) where torch sees no CUDA device: one line that says so and how to
run on the CPU, exit status 2, no traceback; the line's CPU options are a valid bench command line."""

import pytest
import torch

import oasis_exec.__main__ as cli


@pytest.mark.parametrize("argv", [["bench"], ["bench", "--device", "cuda:1"], ["generate", "--max-tokens", "2"]])
def test_no_cuda_is_one_line_naming_the_cpu_run(monkeypatch, capsys, argv):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "no CUDA device here" in err and cli.CPU_RUN in err


def test_the_suggested_cpu_run_is_a_valid_bench_command_line():
    a = cli.build_parser().parse_args(["bench", *cli.CPU_RUN.split()])
    cfg, bc = cli.prepare_bench(a)
    cli.check_device(cfg)  # the CPU: nothing to say
    assert (cfg.device, cfg.model, bc.context, bc.concurrency, bc.steps) == ("cpu", "tiny", 512, 2, 4)
