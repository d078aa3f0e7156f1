"""A wheel installed outside the checkout finds everything it ships: profiles, presets,
scenarios and sweep spaces (by name), and the published runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    src.mkdir()
    shutil.copytree(ROOT / "simulator", src / "simulator", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "wheel")], check=True, capture_output=True)
    wheel = next((tmp / "wheel").glob("llmsim-*.whl"))
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    work = tmp / "work"
    work.mkdir()
    return site, work, {**os.environ, "PYTHONPATH": str(site), "LLMSIM_HOME": str(tmp / "home")}


def run(installed, *args):
    site, work, env = installed
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_installed_copy_is_the_one_used(installed):
    site, work, env = installed
    out = subprocess.run([sys.executable, "-c", "import simulator; print(simulator.__file__)"], cwd=work, env=env,
                         capture_output=True, text=True).stdout
    assert out.startswith(str(site))


def test_every_shipped_profile_and_preset_is_listed(installed):
    hardware = run(installed, "hardware", "list").stdout
    for kind in ("accelerators", "nodes"):
        for f in (ROOT / "hardware_profiles" / kind).glob("*.yaml"):
            assert f"\n{f.stem} " in hardware, f.stem
    models = run(installed, "models", "list").stdout
    for f in (ROOT / "models").glob("*.yaml"):
        assert f"\n{f.stem} " in models, f.stem


def test_every_shipped_scenario_evaluates_by_name(installed):
    names = run(installed, "scenarios", "list").stdout.split("\n\n")[0].split()
    scenarios = [n for n in names if not n.startswith("sweeps/")]
    assert set(scenarios) == {p.stem for p in (ROOT / "scenarios").glob("*.yaml")}
    for name in scenarios:
        proc = run(installed, "evaluate", name, "--engine", "analytic")
        assert proc.returncode == 0, proc.stderr
    proc = run(installed, "evaluate", "scenarios/quickstart.yaml", "--json")  # the README's spelling
    assert proc.returncode == 0, proc.stderr


def test_published_runs_and_a_shipped_sweep_work_from_anywhere(installed):
    proc = run(installed, "validate", "--published", "--engine", "analytic")
    assert proc.returncode == 0 and "expressible published runs" in proc.stdout, proc.stderr
    proc = run(installed, "sweep", "sweeps/gpt3-175b-tp-pp", "-o", "out/r.csv", "--workers", "1", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (installed[1] / "out" / "r.csv").is_file()
    assert run(installed, "--version").stdout.startswith("llmsim ")
