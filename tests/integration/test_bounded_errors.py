"""Issue 35, class 1: error messages are bounded whatever the input. A 238-byte YAML alias bomb (a 4.3 MB error
line at 7e01859), a value of 100,000 characters, a request field named by a megabyte: each ends in one short line
(or a short JSON error), quickly; alias expansion is refused past ``MAX_EXPANDED_NODES`` values."""

import time

import pytest

from oasis_sim.cli import main as sim_main

BOMB = (
    "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
)
L = "[" + ", ".join(["lol"] * 9) + "]"
FLOW_BOMB = (  # the anchors inside one value (a top-level key would be refused as unknown first)
    f"[&a {L}, &b [{', '.join(['*a'] * 9)}], &c [{', '.join(['*b'] * 9)}], &d [{', '.join(['*c'] * 9)}], "
    f"&e [{', '.join(['*d'] * 9)}], [*e, *e, *e, *e, *e, *e, *e, *e, *e]]"
)
LIMIT = 2000  # characters of one error line, with the program's prefix and the file's path


def test_show_is_bounded_and_fast_on_a_shared_graph():
    from oasis_core.echo import show

    x = ["lol"] * 9
    for _ in range(30):  # 9^30 leaves once expanded: repr() would never end
        x = [x] * 9
    t0 = time.monotonic()
    s = show(x)
    assert time.monotonic() - t0 < 0.1 and len(s) <= 80, s
    assert "..." in show("p" * 10_000) and len(show("p" * 10_000)) <= 302
    assert show(12) == "12" and show("top") == "'top'"


def test_one_line_caps_any_message():
    from oasis_core.cliargs import one_line

    line = one_line("x: " + "y" * 10_000_000)
    assert len(line) < 1100 and line.endswith("[message cut: 10000003 characters]")
    assert one_line("a\n  b") == "a b"


def test_alias_expansion_is_refused_past_the_bound():
    from oasis_sim.yaml_load import MAX_EXPANDED_NODES, YamlError, load_yaml

    with pytest.raises(YamlError, match="aliases expand to more than"):
        load_yaml(BOMB + "f: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n")
    with pytest.raises(YamlError, match="refers to a node that contains it"):
        load_yaml("a: &a [1, *a]\n")
    ok = load_yaml("base: &b {top_k: 64}\nx: *b\ny: [*b, *b]\n")  # ordinary anchors stay fine
    assert ok == {"base": {"top_k": 64}, "x": {"top_k": 64}, "y": [{"top_k": 64}, {"top_k": 64}]}
    assert MAX_EXPANDED_NODES >= 10_000


@pytest.mark.parametrize(
    "text",
    [
        "top_k: " + FLOW_BOMB + "\n",  # 531,441 values once expanded: refused at load
        "top_k: " + FLOW_BOMB.replace(", [*e, *e, *e, *e, *e, *e, *e, *e, *e]", "") + "\n",  # 66,430: echoed
        "top_k: [" + ", ".join(["7"] * 60_000) + "]\n",  # under the alias bound, echoed through show()
        "mode: " + "z" * 200_000 + "\n",
        "synthetic: {drift_rate: [" + ", ".join(["0.5"] * 60_000) + "]}\n",
    ],
    ids=["bomb", "small-bomb", "long-list", "long-string", "long-synthetic"],
)
def test_sim_config_errors_are_short(tmp_path, capsys, text):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    t0 = time.monotonic()
    assert sim_main(["run", "--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < LIMIT, (len(err), err[:300])
    assert time.monotonic() - t0 < 20


def test_sweep_grid_errors_are_short(tmp_path, capsys):
    g = tmp_path / "g.yaml"
    g.write_text("grid:\n  top_k: [" + ", ".join(["[1, 2, 3]"] * 20_000) + "]\n")
    assert sim_main(["sweep", str(g), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < LIMIT, (len(err), err[:300])


def test_exec_option_errors_are_short(capsys):
    from oasis_exec.__main__ import main

    for argv in (
        ["bench", "--device", "cpu", "--fetch-policy", "q" * 100_000],
        ["bench", "--device", "cpu", "--model", "m" * 100_000],
        ["serve", "--served-model-name", " " * 100_000],
    ):
        try:
            rc = main(argv)
        except SystemExit as e:  # serve's option checks exit through argparse
            rc = e.code
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and len(err) < LIMIT, (argv[:2], len(err), err[:300])


def test_server_error_bodies_are_short():
    pytest.importorskip("fastapi")
    import httpx
    from server_fakes import FakeEngine, serve_app

    from oasis_exec.server.app import create_app
    from oasis_exec.server.config import ServerConfig
    from oasis_exec.server.tokenizer import ByteTokenizer

    app = create_app(FakeEngine(step_s=0), ByteTokenizer(), ServerConfig())
    with serve_app(app) as url:
        for body in (
            {"model": "fake", "prompt": "a", "k" * 1_000_000: 1},  # an unknown field named by a megabyte
            {"model": "m" * 1_000_000, "prompt": "a"},  # echoed in "does not exist"
            {"model": "fake", "prompt": "a", "logit_bias": {"9" * 1_000_000: 5}},
        ):
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert 400 <= r.status_code < 500, r.status_code
            assert len(r.content) < 3000, (r.status_code, len(r.content), r.text[:300])
