"""Attribution: who slowed a request, by how much, through which resource.

The baseline step cost (`cost_model`) and the scheduler re-simulation (`scheduler_sim`, with `sim_step` for
vLLM's scheduling rules and `sim_trace` for a victim's per-step waits) answer counterfactuals: the victim's
TTFT and ITL with some requests removed, and each culprit's Shapley share of the slowdown.
"""

from attrib_agent.attribution.cost_model import StepCoefficients, StepCostModel, StepCostPrior, StepFeatures
from attrib_agent.attribution.scheduler_sim import shapley, simulate, slowdown_shares

__all__ = ["StepCoefficients", "StepCostModel", "StepCostPrior", "StepFeatures", "shapley", "simulate",
           "slowdown_shares"]
