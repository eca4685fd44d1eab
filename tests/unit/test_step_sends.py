"""When a finished training step goes to the ranks (tensor/controller/step_sends.py): as the
next begins only where the controller's host has a core to spare beside one per process, and
only after a step that read nothing. The sends themselves, against real ranks, are in
tests/tensor/test_tensor_step.py."""

from __future__ import annotations

import pytest

from actormesh import config
from actormesh.tensor.controller.step_sends import StepSends


@pytest.mark.parametrize(
    ("here", "cores", "each_step"), [(1, 2, True), (4, 5, True), (4, 4, False), (4, 2, False)]
)
def test_steps_go_one_by_one_only_where_a_core_is_left_for_the_controller(
    monkeypatch: pytest.MonkeyPatch, here: int, cores: int, each_step: bool
) -> None:
    monkeypatch.setattr(config, "USABLE_CORES", cores)
    assert StepSends(processes_here=here).each_step is each_step


def test_a_step_goes_as_the_next_begins_unless_it_read_or_sent_nothing() -> None:
    steps = StepSends(processes_here=0)
    assert steps.each_step
    assert not steps.over  # no step ended yet: the first op sends nothing
    steps.ended(buffered=30)
    assert steps.over and steps.begins()  # it read nothing: it goes
    assert not steps.over
    steps.read = True  # a sync point within the step, before its update
    steps.ended(buffered=5)
    assert not steps.begins()  # the update waits for the next read
    assert not steps.read  # the next step starts with no read
    steps.ended(buffered=0)
    assert not steps.begins()  # nothing left to send
    steps.each_step = False  # a host with no core to spare
    steps.ended(buffered=30)
    assert not steps.begins()
