"""llmsim: an analytical performance simulator for LLM training plans.

    from simulator import load_scenario, evaluate
    result = evaluate(load_scenario("scenarios/quickstart.yaml"))
    result.to_dict()["step_time_s"]

    from simulator import sweep
    table = sweep("scenarios/sweeps/gpt3-175b-tp-pp.yaml")   # pandas.DataFrame, one row per point
    table = sweep({"base_file": "scenarios/quickstart.yaml", "sweep": {"plan.tp": [1, 2, 4], "plan.dp": "auto"}})

Scenario and space files are paths or the names of shipped ones (`quickstart`). Every bad
argument or input raises InputError (a ValueError) whose message is one line naming the
field, the value and what is allowed; NumPy scalars are accepted where numbers are.
"""

from .errors import InputError
from .evaluate import evaluate
from .result import Result
from .scenario import Scenario, apply_overrides, load_scenario, read_scenario, scenario_from_dict
from .space import Space, load_space, space_from_dict
from .sweep import sweep  # the function: simulator.sweep(space) -> DataFrame (module: sys.modules["simulator.sweep"])

__all__ = ["InputError", "Result", "Scenario", "Space", "apply_overrides", "evaluate", "load_scenario", "load_space",
           "read_scenario", "scenario_from_dict", "space_from_dict", "sweep"]
