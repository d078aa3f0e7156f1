"""provenance.py: every number of a shipped hardware profile states where it comes from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simulator.hardware import available
from simulator.provenance import KINDS, profile_file, provenance_rows, source_of, unsourced
from simulator.yamlio import load_yaml

SHIPPED = [(kind, name) for kind in KINDS for name in available(kind)]


@pytest.mark.parametrize("kind,name", SHIPPED, ids=lambda v: str(v))
def test_every_number_of_a_shipped_profile_states_its_source(kind, name):
    found, path = profile_file(name)
    assert found == kind
    assert unsourced(provenance_rows(load_yaml(path))) == []


def test_a_number_without_a_source_is_named():
    data = {"name": "x", "tdp_w": 700, "peak_tflops": {"bf16": 989}, "sources": {"peak_tflops": "datasheet"}}
    assert unsourced(provenance_rows(data)) == ["tdp_w"]


def test_the_most_specific_source_applies():
    sources = {"efficiency.matmul": "the fit", "efficiency": "a table", "efficiency.matmul.max": "own"}
    assert source_of("efficiency.matmul.max", sources) == "own"
    assert source_of("efficiency.matmul.half_flops", sources) == "the fit"
    assert source_of("efficiency.memory.max", sources) == "a table"
    assert source_of("tdp_w", sources) == ""


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "simulator.cli", "hardware", *args], capture_output=True,
                          text=True, timeout=120)


def test_hardware_show_prints_a_profiles_numbers_beside_their_sources():
    proc = _cli("show", "b300", "--json")
    assert proc.returncode == 0, proc.stderr
    fields = {f["field"]: f for f in json.loads(proc.stdout)["fields"]}
    assert fields["efficiency.mamf.bf16"]["value"] == 0.786
    assert "1769.0 / 2250" in fields["efficiency.mamf.bf16"]["source"]
    text = _cli("show", "dgx-b300").stdout
    assert "nic_gbit_per_s = 800" in text and "ConnectX-8" in text


def test_hardware_show_of_an_unknown_profile_is_one_line_naming_the_known_ones():
    proc = _cli("show", "h900")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "h900" in lines[0] and "b300" in lines[0]
