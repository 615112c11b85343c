"""The engine cost model: how long a decode step and a prefill take on an instance.

Routing (throughput_optimal), coordination (hypothesis_test sync), the simulator and the config
checks all read it, so it sits below them: `model` holds the formula and its file format, `fit`
fits it to profiled steps (`psrl calibrate`).
"""

from psrl.engine_cost.model import CostModel, CostModelError, load_cost_model

__all__ = ["CostModel", "CostModelError", "load_cost_model"]
