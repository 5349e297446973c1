"""bench/host.py: the chains it times do what its per-op costs assume."""

from __future__ import annotations

import pytest
import torch

from meshplan.bench.host import CHAIN, Chain, SavingChain, checkpointed, count_ops
from meshplan.bench.pipeline import action_seconds
from meshplan.profiles import load_profile
from meshplan.profiles.schema import profile_from_dict


def _step(module: torch.nn.Module) -> int:
    x = torch.ones(8, requires_grad=True)
    return count_ops(lambda: module(x).sum().backward())


@pytest.mark.parametrize("chain", [Chain, SavingChain])
def test_each_chain_dispatches_one_op_forward_and_one_backward_per_link(chain):
    # CHAIN ops, their CHAIN grad ops, and the sum and its seed (ones_like, expand); a fresh leaf's gradient
    # is stored, not added. The detaches a dispatch mode adds per saved tensor (tanh's) are not counted.
    assert _step(chain()) == 2 * CHAIN + 3


def test_both_wrappers_replay_the_whole_forward_once():
    plain = _step(SavingChain())
    assert _step(checkpointed(selective=False)) == plain + CHAIN
    assert _step(checkpointed(selective=True)) == plain + CHAIN


def test_wrapped_chains_give_the_plain_chains_gradient():
    x = torch.linspace(-1, 1, 8, requires_grad=True)
    SavingChain()(x).sum().backward()
    want = x.grad.clone()
    for selective in (False, True):
        x.grad = None
        checkpointed(selective)(x).sum().backward()
        assert torch.equal(x.grad, want)


def test_profiles_without_checkpoint_costs_load_and_keep_them_unset():
    data = load_profile("cpu-gloo").to_dict()
    data["overheads"].pop("checkpoint_op_s")
    got = profile_from_dict(data, "test")
    assert got.overheads.checkpoint_op_s is None and got.overheads.sac_op_s is None
    data["overheads"]["checkpoint_op_s"] = 1.5e-5
    assert profile_from_dict(data, "test").overheads.checkpoint_op_s == 1.5e-5


@pytest.mark.parametrize("schedule, v, m", [("1F1B", 1, 8), ("Interleaved1F1B", 2, 8), ("Interleaved1F1B", 2, 16)])
def test_the_per_action_cost_is_read_back_through_the_schedule_simulation(schedule, v, m):
    """A step simulated with known action and p2p times gives the action time back."""
    from meshplan.cost_models.pipeline import simulate

    n, action, p2p = 2 * v, 4e-4, 2e-4
    step = simulate(schedule, 2, v, m, [action] * n, [action] * n, [0.0] * n, p2p).makespan
    record = {"schedule": schedule, "pp": 2, "v": v, "m": m, "step_s": step}
    assert action_seconds(record, p2p) == pytest.approx(action, rel=1e-6)
    # Transfers slower than the whole measured step: nothing is left to the actions.
    assert action_seconds(record, step) == 0.0


def test_costs_are_differences_of_one_rounds_chains():
    """Hand values: 131 ops of the plain chain at 2 us, DTensor's at 10 us, checkpointing 64 x 14 us on
    top of the bare saving chain, the policy 64 x 20 us on top of that."""
    from meshplan.bench.host import costs_of

    times = {"plain": 131 * 2e-6, "dtensor": 131 * 10e-6, "bare": 300e-6, "full": 300e-6 + 64 * 14e-6,
             "selective": 300e-6 + 64 * 34e-6}
    got = costs_of(times, 131)
    assert (got.op_dispatch_s, got.python_dispatch_s, got.checkpoint_op_s, got.sac_op_s) == (
        pytest.approx(2e-6), pytest.approx(8e-6), pytest.approx(14e-6), pytest.approx(20e-6))
    # A faster variant than its base leaves no negative cost.
    assert costs_of(dict(times, dtensor=times["plain"] / 2), 131).python_dispatch_s == 0.0
