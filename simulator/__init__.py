"""llmsim: an analytical performance simulator for LLM training plans.

    from simulator import load_scenario, evaluate
    result = evaluate(load_scenario("scenarios/quickstart.yaml"))
    result.to_dict()["step_time_s"]
"""

from .errors import InputError
from .evaluate import evaluate
from .result import Result
from .scenario import Scenario, apply_overrides, load_scenario, read_scenario, scenario_from_dict

__all__ = ["InputError", "Result", "Scenario", "apply_overrides", "evaluate", "load_scenario", "read_scenario",
           "scenario_from_dict"]
