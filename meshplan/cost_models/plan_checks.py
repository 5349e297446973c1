"""Checks of a complete plan against the cluster profile it names: the fields a plan file alone
cannot judge. `estimate` and `run` refuse what fails, in one line naming the field."""

from __future__ import annotations

from meshplan.cost_models.estimate import group_spans, placement_of, plan_order
from meshplan.cost_models.layout import layout_of
from meshplan.errors import InputError
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan
from meshplan.specs.rules import float8_compile_reason


def float8_reason(float8: bool, prof: ClusterProfile) -> str | None:
    """Why float8 cannot run on this profile's device, or None. torchao's float8 training needs
    fp8 tensor cores (compute capability 8.9 or later: Ada, Hopper, Blackwell); an A100 has none.
    A profile lists an fp8 peak exactly when its device has them (the planner offers float8 by the
    same test, ClusterProfile.supports_float8)."""
    if float8 and not prof.supports_float8():
        return (f"true needs fp8 tensor cores, which {prof.device.name} lacks (its profile has peaks for "
                f"{', '.join(sorted(prof.device.peak_tflops))} only); set false")
    return None


def mesh_placement(plan: Plan, prof: ClusterProfile) -> dict[str, str]:
    """The link level each parallel group of the plan runs over on this cluster, as its mesh_order
    lays the ranks out (what the estimate prices)."""
    return placement_of(group_spans(layout_of(plan), prof, plan_order(plan)), prof)


def check_placement(plan: Plan, prof: ClusterProfile) -> None:
    """A plan's `placement` must name the profile's link levels and agree with where its mesh_order
    puts each group (the runtime lays ranks out by mesh_order; placement says where that lands)."""
    if not plan.placement:
        return
    levels = [link.name for link in prof.links]
    actual = mesh_placement(plan, prof)
    order = list(plan_order(plan))
    for dim, level in plan.placement.items():
        if level not in levels:
            raise InputError(f"placement.{dim}", f"must be one of {prof.name}'s link levels ({', '.join(levels)}), "
                                                 f"got {level!r}")
        if dim not in actual:
            raise InputError(f"placement.{dim}", "places a group of size 1 (nothing to place); remove it")
        if actual[dim] != level:
            raise InputError(f"placement.{dim}", f"is {level}, but mesh_order {order} puts the {dim} group on "
                                                 f"{actual[dim]} on {prof.name}; change mesh_order or placement")


def check_against_profile(plan: Plan, prof: ClusterProfile) -> None:
    why = float8_reason(bool(plan.memory.float8), prof) or float8_compile_reason(bool(plan.memory.float8),
                                                                                   bool(plan.compile), plan.stack)
    if why:
        raise InputError("memory.float8", why)
    if plan.memory.offload_modules and prof.device.host_link_gbs is None:
        raise InputError("memory.offload_modules", f"needs the link to host memory it copies over, which "
                                                   f"{prof.name} does not give (device.host_link_gbs); set it")
    check_placement(plan, prof)
