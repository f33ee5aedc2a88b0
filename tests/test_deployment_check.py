"""The deployment check (tier T4) fails on a bundle that cannot run: it
imports the bundle in real Pyodide with the SDK vendored next to it."""

import importlib.util
import shutil

import pytest

from fidelity.pyodide_host import ROOT, copy_sdk

pytestmark = [pytest.mark.pyodide]


def _build_deployment():
    spec = importlib.util.spec_from_file_location("build_deployment", ROOT / "scripts" / "build_deployment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bundle(tmp_path, edit=None):
    """A bundle laid out as wrangler writes it: src/'s modules, the SDK in python_modules/."""
    bundle = tmp_path / "bundle"
    shutil.copytree(ROOT / "src", bundle, ignore=shutil.ignore_patterns("__pycache__"))
    copy_sdk(bundle / "python_modules")
    if edit:
        entry = bundle / "entry.py"
        old, new = edit
        assert old in entry.read_text()
        entry.write_text(entry.read_text().replace(old, new, 1))
    return bundle


def test_the_pyodide_tier_and_the_deployment_use_one_sdk_version(tmp_path):
    # The tiers copy the SDK uv.lock installed; the deployment vendors pyproject.toml's pin.
    assert copy_sdk(tmp_path / "sdk") == _build_deployment().sdk_pin()


def test_a_sound_bundle_passes(tmp_path, capsys):
    _build_deployment().check_imports(_bundle(tmp_path))
    assert "Bundle imports in Pyodide" in capsys.readouterr().out


@pytest.mark.parametrize("edit, why", [
    (("import zlib\n", "import zlib\nimport ssl  # noqa: F401\n"), "No module named 'ssl'"),
    (("import zlib\n", "import zlib\nimport yaml  # noqa: F401\n"), "No module named 'yaml'"),
    (("class AccountLimit(", "class AccountLimits("), "lacks ['AccountLimit']"),
    (("from durability.locks import PlaceLost, WaitTimeout, semaphore\n",
      "from durability.locks import PlaceLost, SemaphoreHolder, WaitTimeout, semaphore  # noqa: F401\n"),
     "does not bind: ['SemaphoreHolder']"),
])
def test_a_bundle_that_cannot_run_fails(tmp_path, capsys, edit, why):
    with pytest.raises(SystemExit):
        _build_deployment().check_imports(_bundle(tmp_path, edit))
    assert why in capsys.readouterr().err
