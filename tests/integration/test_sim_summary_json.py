"""summary.json is standard JSON: NaN and infinities become null at any depth."""

import json
import math

from oasis_sim.metrics import dumps_summary, finite_json


def test_non_finite_numbers_become_null():
    s = {"a": float("nan"), "b": [1.0, float("inf"), {"c": -math.inf}], "d": (2, 3.5), "e": "NaN", "f": 0}
    text = dumps_summary(s)
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    back = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert back == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, 3.5], "e": "NaN", "f": 0}
    assert finite_json(1.5) == 1.5 and finite_json(True) is True


def test_bad_out_is_refused_before_the_run(tmp_path, capsys):
    from oasis_sim.cli import main

    f = tmp_path / "afile"
    f.write_text("x")
    assert main(["run", "--out", str(f), "--quiet"]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert main(["run", "--out", str(f / "sub"), "--quiet"]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_runaway_profile_steps_are_refused(tmp_path, capsys):
    from oasis_sim.cli import main
    from oasis_sim.config import MAX_PROFILE_STEPS

    assert main(["run", "--profile-steps", str(MAX_PROFILE_STEPS + 1), "--quiet", "--out", str(tmp_path)]) == 2
    assert "--profile-steps: must be <=" in capsys.readouterr().err
