"""Cast plans across hosts (relay.py): which ranks a sender reaches directly, which agents relay."""

from __future__ import annotations

from actormesh.runtime.proc_table import ProcTable
from actormesh.runtime.relay import plan
from actormesh.runtime.shape import Shape
from actormesh.runtime.transport import Address
from actormesh.runtime.wire import shape_state


def _table() -> tuple[ProcTable, list[Address | None]]:
    # {hosts: 3, gpus: 2}: host 0 is the controller's own (no relay), hosts 1 and 2 remote.
    agents: list[Address | None] = [None]
    agents += [Address(f"h{i}", None, f"tcp://10.0.0.{i}:1", bytes([i]) * 8) for i in (1, 2)]
    addresses = [Address(f"h{r // 2}", f"ipc://w{r}", None, bytes([16 + r]) * 8) for r in range(6)]
    relays = [agents[r // 2] for r in range(6)]
    return ProcTable("plan-test", addresses, [str(r) for r in range(6)], relays), agents


def test_the_controller_reaches_remote_hosts_through_their_agents_only() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2})
    direct, relayed = plan(table, shape, shape_state(shape), "controller-host")
    assert direct == (0, 1)
    assert relayed == (agents[1], agents[2])


def test_a_sender_on_a_remote_host_reaches_its_siblings_directly() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2})
    direct, relayed = plan(table, shape, shape_state(shape), "h1")
    assert direct == (0, 1, 2, 3)
    assert relayed == (agents[2],)


def test_a_slice_touches_only_its_hosts_and_the_plan_is_cached() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2}).slice(hosts=2, gpus=1)
    first = plan(table, shape, shape_state(shape), "controller-host")
    assert first == ((), (agents[2],))
    assert plan(table, shape, shape_state(shape), "controller-host") is first
