"""Every `llmsim` command of the README runs (exit 0) from an empty working folder, as a new
user would type it; what it writes lands in that folder."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = ROOT / "tests" / "data" / "imports"
# Files the README's import examples name, as the fixtures they are.
CONFIGS = {"llama3_8b.toml": "torchtitan-llama3_8b.toml",
           "train_gpt3_175b_distributed.sh": "megatron-train_gpt3_175b_distributed.sh",
           "llama3.1_70b.yaml": "nemo-llama3.1_70b.yaml", "ds_config.json": "deepspeed-ds_config_zero3.json",
           "config.yaml": "bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml"}
TORCH = ("calibrate", "validate --torch")  # run with --quick here: the full measurement takes minutes


def readme_commands() -> list[str]:
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()]
    return [line for line in lines if line.startswith(".venv/bin/llmsim ")]


def test_the_readme_has_commands():
    assert len(readme_commands()) >= 25


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    for name, fixture in CONFIGS.items():
        shutil.copy(IMPORTS / fixture, work / name)
    return work


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(command, workdir):
    args = shlex.split(command, comments=True)[1:]
    if any(" ".join(args).startswith(t) for t in TORCH):
        pytest.importorskip("torch")
        args.append("--quick")
    env = {**os.environ, "LLMSIM_HOME": str(workdir / "home"), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=workdir, capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_readme_commands_write_into_the_working_folder_only(workdir):
    """After the commands above (module order), their outputs are in the working folder."""
    written = {p.relative_to(workdir).as_posix() for p in workdir.rglob("*") if p.is_file()}
    assert {"out/step.json", "out/results.parquet", "out/heatmap.png", "out/timeline.png"} <= written
