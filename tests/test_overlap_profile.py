"""The accelerator profile's optional efficiency.overlap_slowdown."""

import pytest

from simulator.errors import InputError
from simulator.hardware import accelerator_from_dict, profiles_dir
from simulator.yamlio import load_yaml


def a100():
    return dict(load_yaml(profiles_dir() / "accelerators" / "a100-sxm-80gb.yaml", "profile"))


def test_overlap_slowdown_defaults_to_no_slowdown():
    data = a100()
    data["efficiency"] = {k: v for k, v in data["efficiency"].items() if k != "overlap_slowdown"}
    assert accelerator_from_dict(data, "a100").overlap_slowdown == 0.0


def test_overlap_slowdown_is_read_from_the_profile():
    data = a100()
    data["efficiency"] = {**data["efficiency"], "overlap_slowdown": 0.15}
    assert accelerator_from_dict(data, "a100").overlap_slowdown == 0.15


def test_negative_overlap_slowdown_is_an_input_error():
    data = a100()
    data["efficiency"] = {**data["efficiency"], "overlap_slowdown": -0.1}
    with pytest.raises(InputError, match="overlap_slowdown"):
        accelerator_from_dict(data, "a100")
