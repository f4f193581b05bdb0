"""``sweep --ray``: the points as Ray tasks on a local Ray instance give the local sweep's rows (same columns,
values and order; a failing point keeps its row with ``error``). Skipped only when Ray is not installed."""

import json
import sys

import pandas as pd
import pytest

from oasis_sim.cli import main


@pytest.fixture
def grid(tmp_path):
    """Two tiny points: the first runs, the second fails inside its task (a top-K too large to hold)."""
    trace = tmp_path / "t.json"
    trace.write_text(
        json.dumps(
            {
                "schema": "oasiskv-trace",
                "version": 1,
                "requests": [
                    {"id": 0, "arrival_s": 0.0, "prompt_tokens": 600, "output_tokens": 3},
                    {"id": 1, "arrival_s": 0.1, "prompt_tokens": 900, "output_tokens": 2},
                ],
            }
        )
    )
    g = tmp_path / "g.yaml"
    g.write_text(
        f"trace: {trace}\nbase: {{mode: lookahead, max_requests: 2, policy_layers: 1, profile_steps: 4, "
        "timeline_steps: 0}\ngrid:\n  top_k: [16, 1000000000]\n"
    )
    return str(g)


def test_ray_rows_match_the_local_sweep(grid, tmp_path, capsys):
    pytest.importorskip("ray")
    assert main(["sweep", grid, "--out", str(tmp_path / "local"), "--workers", "1"]) == 2
    assert main(["sweep", grid, "--out", str(tmp_path / "ray"), "--workers", "1", "--ray", "local"]) == 2
    err = capsys.readouterr().err
    assert "1 of 2 points failed" in err and "point 1 (top_k=1000000000)" in err
    local, ray = (pd.read_csv(tmp_path / d / "sweep.csv", keep_default_na=False) for d in ("local", "ray"))
    assert list(ray.columns) == list(local.columns)
    assert ray["error"].iloc[0] == "" and ray["error"].iloc[1].startswith("ConfigError: top_k:")
    assert float(local["requests_completed"].iloc[0]) == 2  # the failed row leaves it empty: strings here
    pd.testing.assert_frame_equal(ray.drop(columns="wall_s"), local.drop(columns="wall_s"))  # wall time differs
    import ray as ray_mod

    assert not ray_mod.is_initialized()  # the local instance the sweep started is stopped


def test_without_ray_installed_the_option_is_one_line(grid, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--ray", "local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Ray is not installed" in err and "oasiskv[sweep]" in err


def test_an_unreachable_cluster_is_one_line(grid, tmp_path, capsys):
    pytest.importorskip("ray")
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--ray", "127.0.0.1:1"]) == 2  # nothing listens
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray 127.0.0.1:1: cannot reach it" in err
