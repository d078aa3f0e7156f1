"""The Python API: every bad argument raises InputError (one line), NumPy scalars are numbers."""

import numpy as np
import pytest

from simulator import (InputError, apply_overrides, evaluate, load_scenario, load_space, read_scenario,
                       scenario_from_dict, space_from_dict, sweep)
from simulator.search import SearchOptions, search

BASE = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 1},
        "plan": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8}}

BAD_CALLS = {
    "evaluate a path": lambda: evaluate("scenarios/quickstart.yaml"),
    "evaluate a dict": lambda: evaluate(BASE),
    "evaluate engine list": lambda: evaluate(scenario_from_dict(BASE), engine=["graph"]),
    "load_scenario int": lambda: load_scenario(5),
    "load_scenario None": lambda: load_scenario(None),
    "load_scenario overrides list": lambda: load_scenario("quickstart", ["plan.tp"]),
    "load_scenario overrides int key": lambda: load_scenario("quickstart", {1: 2}),
    "load_scenario empty key part": lambda: load_scenario("quickstart", {"plan..tp": 2}),
    "read_scenario missing": lambda: read_scenario("/nonexistent/x.yaml"),
    "apply_overrides list": lambda: apply_overrides([1], {}),
    "scenario_from_dict list": lambda: scenario_from_dict([1, 2]),
    "scenario_from_dict string tp": lambda: scenario_from_dict({**BASE, "plan": {**BASE["plan"], "tp": "2"}}),
    "scenario_from_dict array tp": lambda: scenario_from_dict({**BASE, "plan": {**BASE["plan"], "tp": np.array([1])}}),
    "scenario_from_dict nan": lambda: scenario_from_dict({**BASE, "training": {"tokens": np.float64("nan")}}),
    "space_from_dict list": lambda: space_from_dict([1]),
    "space_from_dict base_dir int": lambda: space_from_dict({"base": BASE, "sweep": {}}, base_dir=3),
    "load_space int": lambda: load_space(3),
    "sweep int": lambda: sweep(3),
    "sweep workers -1": lambda: sweep({"base": BASE, "sweep": {"plan.tp": [1]}}, workers=-1, progress=False),
    "sweep chunk_size -1": lambda: sweep({"base": BASE, "sweep": {"plan.tp": [1]}}, chunk_size=-1, progress=False),
    "sweep engine": lambda: sweep({"base": BASE, "sweep": {"plan.tp": [1]}}, engine=None, progress=False),
    "search objective list": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8, objective=["cost"]),
    "search engine": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8, engine=1),
    "search batch float": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8.5),
    "search top str": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8, top="3"),
    "search model int": lambda: search(7, {"node": "dgx-a100"}, 8),
    "search cluster list": lambda: search("megatron-gpt-1.7b", ["dgx-a100"], 8),
    "search options dict": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8, options={}),
    "search headroom": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8,
                                      options=SearchOptions(memory_headroom=1.5)),
    "search training": lambda: search("megatron-gpt-1.7b", {"node": "dgx-a100"}, 8, training=5),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_api_calls_raise_input_error(name):
    with pytest.raises(InputError) as info:
        BAD_CALLS[name]()
    assert "\n" not in str(info.value)


def test_numpy_scalars_are_accepted_as_numbers():
    plain = scenario_from_dict(BASE)
    numpy = scenario_from_dict({**BASE, "plan": {"tp": np.int64(1), "pp": np.int32(1), "dp": np.int64(8),
                                                 "micro_batch": np.uint8(1), "global_batch": np.int64(8),
                                                 "sequence_parallel": np.bool_(False)},
                                "training": {"tokens": np.float32(1e9)}})
    assert numpy.plan == plain.plan and type(numpy.plan.tp) is int
    assert evaluate(numpy, engine="analytic").step_time_s == evaluate(plain, engine="analytic").step_time_s
    table = sweep({"base": BASE, "sweep": {"plan.micro_batch": [np.int64(1), np.int64(2)]}}, workers=1,
                  progress=False)
    assert list(table["plan.micro_batch"]) == [1, 2]
    result = search("megatron-gpt-1.7b", {"node": "dgx-a100", "nodes": np.int64(1)}, np.int64(8), top=np.int64(2),
                    engine="analytic")
    assert len(result.table) == 2


def test_a_shared_parse_cache_gives_the_same_scenarios_and_refuses_bad_settings_every_time():
    raw = read_scenario("quickstart.yaml")
    cache = {}
    for tp in (1, 2, 1):
        point = apply_overrides(raw, {"plan.tp": tp, "plan.dp": "auto"})
        assert scenario_from_dict(point, cache) == scenario_from_dict(point)
    for _ in range(2):  # an error is not remembered as a result
        with pytest.raises(InputError, match="plan.precision"):
            scenario_from_dict(apply_overrides(raw, {"plan.precision": "fp7"}), cache)
