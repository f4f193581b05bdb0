"""``$OASIS_POLICY_MODULES``: get_policy imports the named modules (importable names or .py paths) before it fails
on an unknown name, once each; an entry that cannot be imported is one ValueError naming it."""

import sys
import textwrap

import pytest

from oasis_core import fetchcap
from oasis_core.fetchcap import POLICY_MODULES_ENV, get_policy, load_policy_modules

POLICY = """
from dataclasses import dataclass

from oasis_core.fetchcap import FetchCapPolicy, register_policy


@dataclass(frozen=True)
class Seven(FetchCapPolicy):
    static = True

    def max_cap(self, top_k):
        return 7

    def cap(self, ctx):
        return 7

    @property
    def spec(self):
        return "{name}"


register_policy("{name}", "{name}", lambda spec, arg: Seven())
"""


@pytest.fixture
def clean(monkeypatch):
    """The registry, the loaded entries and sys.modules as they were before the test."""
    reg, loaded, mods = dict(fetchcap._REGISTRY), set(fetchcap._loaded_modules), set(sys.modules)
    monkeypatch.delenv(POLICY_MODULES_ENV, raising=False)
    yield monkeypatch
    fetchcap._REGISTRY.clear()
    fetchcap._REGISTRY.update(reg)
    fetchcap._loaded_modules.clear()
    fetchcap._loaded_modules.update(loaded)
    for m in set(sys.modules) - mods:
        del sys.modules[m]


def _write(path, name, extra=""):
    path.write_text(textwrap.dedent(POLICY).replace("{name}", name) + extra)
    return path


def test_a_py_path_and_a_module_name_register_their_policies(clean, tmp_path):
    _write(tmp_path / "seven_a.py", "seven-a")
    pkg = tmp_path / "lib"
    pkg.mkdir()
    _write(pkg / "seven_b.py", "seven-b")
    clean.syspath_prepend(str(pkg))
    with pytest.raises(ValueError, match="unknown policy 'seven-a'"):
        get_policy("seven-a")  # not named yet
    clean.setenv(POLICY_MODULES_ENV, f" {tmp_path / 'seven_a.py'} , seven_b ,")
    assert get_policy("seven-a").spec == "seven-a" and get_policy("Seven-B").max_cap(128) == 7
    assert sys.modules["seven_a"].__file__ == str(tmp_path / "seven_a.py")
    assert load_policy_modules() == (str(tmp_path / "seven_a.py"), "seven_b")


def test_a_relative_path_is_from_the_working_directory_and_each_entry_runs_once(clean, tmp_path):
    counter = tmp_path / "count.txt"
    _write(tmp_path / "seven_c.py", "seven-c", f"\nopen({str(counter)!r}, 'a').write('x')\n")
    clean.chdir(tmp_path)
    clean.setenv(POLICY_MODULES_ENV, "seven_c.py")
    assert get_policy("seven-c").spec == "seven-c"
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        get_policy("nope")  # looks again, imports nothing twice
    load_policy_modules()
    assert counter.read_text() == "x"


def test_shipped_names_never_import_the_modules(clean):
    clean.setenv(POLICY_MODULES_ENV, "no_such_module_xyz")
    assert get_policy("fixed:0.05").spec == "fixed:0.05"  # lazily: only an unknown name imports


@pytest.mark.parametrize(
    "entry, why",
    [
        ("no_such_module_xyz", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
        ("missing_file.py", "FileNotFoundError: no such file: .*missing_file.py"),
    ],
)
def test_an_entry_that_cannot_be_imported_is_named(clean, tmp_path, entry, why):
    clean.chdir(tmp_path)
    clean.setenv(POLICY_MODULES_ENV, entry)
    with pytest.raises(ValueError, match=f"{POLICY_MODULES_ENV}: cannot import '{entry}': {why}"):
        get_policy("mine")


def test_a_module_that_raises_is_one_line_and_not_left_half_imported(clean, tmp_path):
    bad = tmp_path / "broken_pol.py"
    bad.write_text("x = 1\nraise RuntimeError('bad\\nnews')\n")
    clean.setenv(POLICY_MODULES_ENV, str(bad))
    with pytest.raises(ValueError) as e:
        get_policy("mine")
    assert str(e.value) == f"{POLICY_MODULES_ENV}: cannot import '{bad}': RuntimeError: bad news"
    assert "broken_pol" not in sys.modules
    with pytest.raises(ValueError, match="cannot import"):
        get_policy("mine")  # still failing, not remembered as loaded


def test_a_module_that_registers_nothing_leaves_a_clear_unknown_name(clean, tmp_path):
    (tmp_path / "empty_pol.py").write_text("")
    clean.setenv(POLICY_MODULES_ENV, str(tmp_path / "empty_pol.py"))
    with pytest.raises(ValueError) as e:
        get_policy("mine:1")
    msg = str(e.value)
    assert msg.startswith(f"fetch cap 'mine:1': unknown policy 'mine' (after importing {POLICY_MODULES_ENV}=")
    assert "choices: fixed[:RATIO]" in msg and f"register_policy in a module named in {POLICY_MODULES_ENV}" in msg


def test_a_file_whose_name_is_taken_by_another_module_is_refused(clean, tmp_path):
    _write(tmp_path / "json.py", "seven-j")
    clean.setenv(POLICY_MODULES_ENV, str(tmp_path / "json.py"))
    with pytest.raises(ValueError, match="cannot import .*json.py': ImportError: a module named 'json' is already"):
        get_policy("seven-j")


def test_the_configs_report_it_as_their_field(clean, tmp_path):
    from oasis_sim.config import ConfigError, SimConfig

    clean.setenv(POLICY_MODULES_ENV, "no_such_module_xyz")
    with pytest.raises(ConfigError, match=f"fetch_policy: {POLICY_MODULES_ENV}: cannot import 'no_such_module_xyz'"):
        SimConfig(fetch_policy="mine", policy_sampling="exact")
