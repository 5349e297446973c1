"""The pipeline schedule model: every schedule of the plan contract as data, simulated and bounded.

schedule.py holds a schedule as data (stage placement, per-rank action orders, in-flight limits);
simulation.py times it over per-stage durations (every block, makespan, bubble, activations in
flight), with state.py holding what each rank may run next and what a block does to it; bounds.py
gives each rank's work and a makespan lower bound without simulating. The public names are
re-exported here: `from meshplan.cost_models.pipeline import simulate`.
"""

from meshplan.cost_models.pipeline.bounds import (Placement, bound_kind, linear_bound_rows, makespan_lower_bound,
                                                  placement, rank_work)
from meshplan.cost_models.pipeline.schedule import (FORWARD_FIRST, SPLIT_BACKWARD, V_SHAPED, RankActions, Schedule,
                                                    backward_order, build_schedule, forward_order, in_flight_limit,
                                                    stage_rank)
from meshplan.cost_models.pipeline.simulation import Block, ScheduleResult, simulate, simulate_cached

__all__ = ["Block", "FORWARD_FIRST", "Placement", "RankActions", "SPLIT_BACKWARD", "Schedule", "ScheduleResult",
           "V_SHAPED", "backward_order", "bound_kind", "build_schedule", "forward_order", "in_flight_limit",
           "linear_bound_rows", "makespan_lower_bound", "placement", "rank_work", "simulate", "simulate_cached",
           "stage_rank"]
