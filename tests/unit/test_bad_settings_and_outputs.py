"""Issue 35, classes 4-6: errors name the file and the problem (a missing .gguf, a broken config.json); server
settings that make no sense are refused at start (``--max-waiting 0``); every command checks its outputs before
the work (``serve --record``, ``--record-hardware``, ``--record-path``), not when it ends."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _exec(*argv, timeout=120):
    p = subprocess.run(
        [sys.executable, "-m", "oasis_exec", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )
    return p.returncode, p.stderr


def test_a_missing_gguf_says_it_is_missing(tmp_path):
    from oasis_exec.model.gguf import read_gguf

    missing = tmp_path / "model.gguf"
    with pytest.raises(ValueError, match=r"model\.gguf: no such file \(a \.gguf model was asked for\)"):
        read_gguf(str(missing))
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ValueError, match=r"dir\.gguf: is a folder"):
        read_gguf(str(tmp_path / "dir.gguf"))


@pytest.mark.parametrize("cmd", [["serve"], ["bench", "--device", "cpu"]])
def test_cli_missing_gguf_is_one_line_naming_file_and_problem(tmp_path, cmd):
    code, err = _exec(*cmd, "--model-path", str(tmp_path / "m.gguf"))
    assert code == 2 and err.count("\n") == 1, err
    assert f"{tmp_path / 'm.gguf'}: no such file" in err and "Traceback" not in err


def test_a_broken_config_json_is_named_with_line_and_column(tmp_path):
    from oasis_exec.model.decoder import read_hf_config

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2,\n')
    with pytest.raises(ValueError) as e:
        read_hf_config(str(tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'config.json'}: not valid JSON") and "line 2 column 1" in msg, msg
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
    with pytest.raises(ValueError, match=r"config\.json: \w+: missing required field"):  # the first field read
        read_hf_config(str(tmp_path))


def test_serve_refuses_a_broken_config_json_naming_it(tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    code, err = _exec("serve", "--model-path", str(tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert f"{tmp_path / 'config.json'}: not valid JSON" in err


def test_server_settings_messages(capsys):
    from oasis_exec.server.cli import parse_config

    for argv, text in [
        (["--max-waiting", "0"], "--max-waiting: must be >= 1"),
        (["--record", "/tmp/r.json", "--record-hardware", "nope"], "--record-hardware: must be one of"),
    ]:
        with pytest.raises(SystemExit):
            parse_config(argv)
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--record", "{bad}"],
        ["serve", "--record", "{folder}"],
        ["bench", "--device", "cpu", "--record-path", "{bad}"],
        ["generate", "--device", "cpu", "--record-path", "{folder}"],
    ],
    ids=["serve-record-unmakeable", "serve-record-folder", "bench-record-path", "generate-record-path"],
)
def test_outputs_are_checked_before_the_work(tmp_path, argv):
    """Exit 2 at once naming the option: the server never starts (7e01859 served, then lost the recording at
    shutdown), the engine never builds."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    subs = {"bad": str(blocker / "sub" / "r.json"), "folder": str(tmp_path)}
    argv = [a.format(**subs) for a in argv]
    code, err = _exec(*argv, timeout=60)
    assert code == 2 and err.count("\n") == 1, err
    assert ("--record-path" if "--record-path" in argv else "--record") in err, err
