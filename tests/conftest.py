import pytest

from simulator.hardware import load_accelerator, load_network, load_node, Cluster
from simulator.scenario import scenario_from_dict


@pytest.fixture
def dgx_a100():
    def make(nodes=1):
        node = load_node("dgx-a100")
        return Cluster(load_accelerator(node.accelerator), node, load_network(node.network), nodes, 8)
    return make


@pytest.fixture
def scenario():
    """A scenario mapping builder: scenario(plan overrides..., model=..., cluster=...)."""
    def make(model=None, cluster=None, **plan):
        plan = {"tp": 1, "pp": 1, "micro_batch": 1, "global_batch": 8, **plan}
        return scenario_from_dict({
            "model": model or {"preset": "megatron-gpt-1.7b"},
            "cluster": cluster or {"node": "dgx-a100", "nodes": 1},
            "plan": plan,
        })
    return make
