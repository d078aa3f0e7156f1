import os
from pathlib import Path

import pytest

from simulator.scenario import scenario_from_dict

# Hardware profiles: the project's own folder unless LLMSIM_PROFILES points elsewhere.
if "LLMSIM_PROFILES" not in os.environ and not (Path(__file__).parent.parent / "hardware_profiles" / "nodes").is_dir():
    for candidate in ("/work/main/hardware_profiles", "/tmp/prof"):
        if Path(candidate, "nodes").is_dir():
            os.environ["LLMSIM_PROFILES"] = candidate
            break


@pytest.fixture
def scenario():
    """A scenario builder: scenario(plan overrides..., model=..., cluster=...)."""
    def make(model=None, cluster=None, **plan):
        plan = {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8, **plan}
        return scenario_from_dict({
            "model": model or {"preset": "megatron-gpt-1.7b"},
            "cluster": cluster or {"node": "dgx-a100", "nodes": 1},
            "plan": plan,
        })
    return make
