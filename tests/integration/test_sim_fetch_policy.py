"""The simulator's ``fetch_policy`` knob: the default keeps every output byte-identical, an adaptive policy gets the
engine's step time and link rate through ``CapContext``, and bad specs exit 2 with one line naming the option."""

import json

import numpy as np
import pytest
from sim_cases import OUTPUTS, QUICK4, run_outputs

from oasis_core.fetchcap import FetchCapPolicy, Fixed, LinkBudget, Unlimited, register_policy
from oasis_sim.cli import main
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.policy import PolicyRunner, StepLink, cap_policy


def test_default_policy_follows_fetch_ratio():
    assert cap_policy(SimConfig()) == Fixed(0.05)
    assert cap_policy(SimConfig(fetch_ratio=1.0)) == Unlimited()
    assert cap_policy(SimConfig(fetch_policy="budget:0.8", policy_sampling="exact")) == LinkBudget(0.8)
    assert cap_policy(SimConfig(mode="retrieval", fetch_policy="fixed:0.1")) == Unlimited()


@pytest.mark.parametrize("sampling", ["profile", "exact"])
def test_spelling_out_the_default_changes_only_the_summary_label(tmp_path, sampling):
    base = run_outputs(tmp_path, "a", "--policy-sampling", sampling)
    same = run_outputs(tmp_path, "b", "--policy-sampling", sampling, "--fetch-policy", "fixed:0.05")
    for f in OUTPUTS[1:]:
        assert base[f] == same[f], f
    a, b = json.loads(base["summary.json"]), json.loads(same["summary.json"])
    assert a["config"].pop("fetch_policy") is None and b["config"].pop("fetch_policy") == "fixed:0.05"
    assert "fetch_policy" not in a and b.pop("fetch_policy") == "fixed:0.05" and a == b


def test_budget_policy_runs_and_is_deterministic(tmp_path):
    one = run_outputs(tmp_path, "a", "--policy-sampling", "exact", "--fetch-policy", "budget:0.8")
    two = run_outputs(tmp_path, "b", "--policy-sampling", "exact", "--fetch-policy", "budget:0.8")
    assert one == two
    s = json.loads(one["summary.json"])
    assert s["fetch_policy"] == "budget:0.8" and s["requests_completed"] == 4


@pytest.mark.parametrize(
    "extra, msg",
    [
        (
            ["--fetch-policy", "budget:0.8"],
            "--fetch-policy: 'budget:0.8' is adaptive (its cap follows each step's own state",
        ),
        (
            ["--fetch-policy", "budget:abc", "--policy-sampling", "exact"],
            "--fetch-policy: fetch cap 'budget:abc': LinkBudget.link_fraction: must be a number, got 'abc'",
        ),
        (["--fetch-policy", "lru"], "--fetch-policy: fetch cap 'lru': unknown policy 'lru'"),
    ],
)
def test_bad_fetch_policy_exits_2_with_one_line(tmp_path, capsys, extra, msg):
    assert main(["run", "--out", str(tmp_path / "o"), *QUICK4, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err, err


def test_config_error_names_the_field():
    with pytest.raises(ConfigError, match="^fetch_policy: must be a policy spec string"):
        SimConfig(fetch_policy=0.8)


class Spy(FetchCapPolicy):
    """Records every context the runner hands it; caps like Fixed(0.25)."""

    seen = []

    def max_cap(self, top_k):
        return 4

    def cap(self, ctx):
        Spy.seen.append(ctx)
        return 4

    @property
    def spec(self):
        return "spy"


def test_runner_passes_the_engine_view_to_an_adaptive_policy():
    register_policy("spy", "spy", lambda spec, arg: Spy())
    try:
        cfg = SimConfig(top_k=16, policy_layers=2, policy_sampling="exact", fetch_policy="spy")
        run = PolicyRunner(cfg, [64], seed=1)
        Spy.seen.clear()
        run.step(link=StepLink(None, 30e9, 8192, 5))
        f, m, _, _ = run.step(link=StepLink(0.02, 30e9, 8192, 5))
        first, second = Spy.seen
        model = cfg.model_spec
        assert first.last_step_time_s is None and second.last_step_time_s == 0.02
        assert second.link_bytes_per_s == 30e9 and second.bytes_per_block_head == 8192
        assert second.rows == run.rows == 2 * model.n_kv_heads
        # Each sampled row stands for (layers x kv heads / sampled rows) rows of each of the 5 decoding requests.
        assert second.row_weight == pytest.approx(5 * model.n_layers * model.n_kv_heads / run.rows)
        np.testing.assert_array_equal(second.n_missing, m)  # the first pass equals the plan's drift
        np.testing.assert_array_equal(second.drift_so_far, first.n_missing)
        assert second.bytes_moved_total > 0
    finally:
        from oasis_core import fetchcap

        fetchcap._REGISTRY.pop("spy")
