"""Hardware profiles load, carry a source for every number, and hold the issue's required set."""

import pytest

from simulator.hardware import available, load_accelerator, load_network, load_node, profiles_dir
from simulator.yamlio import load_yaml

REQUIRED_ACCELERATORS = {"v100-sxm-32gb", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200",
                         "mi250x", "mi300x", "gaudi3", "tpu-v5p"}


def test_required_accelerators_and_nodes_exist():
    assert REQUIRED_ACCELERATORS <= set(available("accelerators"))
    assert {"dgx-a100", "dgx-h100"} <= set(available("nodes"))


@pytest.mark.parametrize("kind,loader", [("accelerators", load_accelerator), ("nodes", load_node),
                                         ("networks", load_network)])
def test_every_profile_loads(kind, loader):
    for name in available(kind):
        assert loader(name).name == name


def _numeric_paths(data, prefix=""):
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key in ("sources", "calibration"):
            continue
        if isinstance(value, dict):
            yield from _numeric_paths(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path


@pytest.mark.parametrize("kind", ["accelerators", "nodes", "networks"])
def test_every_number_has_a_source(kind):
    for name in available(kind):
        data = load_yaml(profiles_dir() / kind / f"{name}.yaml")
        sources = set(data["sources"])
        for path in _numeric_paths(data):
            parts = path.split(".")
            covered = any(".".join(parts[:i]) in sources for i in range(1, len(parts) + 1))
            assert covered, f"{kind}/{name}: {path} has no source"


def test_dgx_nodes_match_the_issue():
    a, h = load_node("dgx-a100"), load_node("dgx-h100")
    assert (a.devices_per_node, a.nics, a.nic_bytes_per_s * 8) == (8, 8, 200e9)
    assert (h.devices_per_node, h.nics, h.nic_bytes_per_s * 8) == (8, 8, 400e9)
