"""Values the controller knows without asking the ranks (``controller/known.py``): a model's
integer inputs and what integer ops make of them, read with no round trip, and never stale."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_tensor_step import steps_as_batches  # noqa: F401  (fixture)
from torch import nn

import actormesh as am
from actormesh.tensor import RemoteTensorError, module_to_mesh
from actormesh.tensor.controller import stream as stream_mod
from actormesh.tensor.controller.mesh import tensor_mesh


class Ids(nn.Module):
    """Returns what it is given, through one op: a model's integer inputs on the mesh."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ids * 1


def _sent(mesh: Any) -> int:
    return tensor_mesh(mesh).stream.batches


def _read_here(mesh: Any, t: Any) -> Any:
    """``t.tolist()``, asserting that it sent nothing to the ranks."""
    before = _sent(mesh)
    value = t.tolist()
    assert _sent(mesh) == before, "the read asked the ranks"
    return value


def _from_ranks(t: Any) -> torch.Tensor:
    """``t``'s value as the ranks hold it (``fetch`` asks them, whatever is known)."""
    return am.fetch(t).get(timeout=60)


@pytest.mark.usefixtures("steps_as_batches")  # no idle flush: only a round trip sends
def test_a_models_integer_input_and_integer_ops_on_it_are_read_without_a_round_trip(
    mesh: Any,
) -> None:
    model = module_to_mesh(Ids(), mesh)
    ids = torch.tensor([[3, 1, 0, 0], [5, 9, 2, 0], [1, 1, 1, 1], [7, 0, 0, 0]])
    out = model(ids)
    mask = out != 0
    count = mask.sum()
    full = count == mask.numel()
    rows = mask.long().sum(1)
    last = torch.where(mask, out, -1)[:, -1]
    before = _sent(mesh)
    assert bool(full) is False
    assert count.item() == 10
    assert rows.tolist() == [2, 3, 4, 1]
    assert torch.equal(last.get(), torch.tensor([-1, -1, 1, -1]))
    assert _sent(mesh) == before  # nothing asked of the ranks
    # The ranks hold exactly these values (they ran the same ops on their rows).
    for value, want in ((count, 10), (rows, [2, 3, 4, 1]), (full, False)):
        assert _from_ranks(value).tolist() == want
    # The same batch again: known again (the MeshTensor made for it is reused).
    assert _read_here(mesh, model(ids).sum()) == int(ids.sum())


@pytest.mark.usefixtures("steps_as_batches")
def test_a_write_makes_the_ranks_answer(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    ids = torch.arange(8).reshape(4, 2)
    out = model(ids)
    total = out.sum()
    view = out.view(-1)
    view.add_(1)  # in place, through a view: every known value is forgotten
    before = _sent(mesh)
    assert out.sum().item() == int(ids.sum()) + 8
    assert total.item() == int(ids.sum())  # made before the write: the ranks still say so
    assert _sent(mesh) > before
    # The user's tensor changed in place: a new upload, known as it is now.
    ids += 10
    assert _read_here(mesh, model(ids).sum()) == int(ids.sum())


@pytest.mark.usefixtures("steps_as_batches")
def test_floats_random_ops_and_other_writes_are_never_known(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    ids = torch.arange(8).reshape(4, 2)
    out = model(ids)
    cases = {
        "a float result": lambda: out.float().mean(),
        "a parameter's value": lambda: out * model.scale.long(),
        "a random op": lambda: torch.randint_like(out, 5),
    }
    for what, make in cases.items():
        value = make()
        before = _sent(mesh)
        got = value.get()
        assert _sent(mesh) > before, what
        assert torch.equal(got, _from_ranks(value)), what
    # A remote call may write its arguments on the ranks: it forgets what was known.
    five = model(torch.tensor(5))  # no dims: replicated
    _add_one(five)
    assert five.item() == 6


@am.remote(propagate=lambda t: t)
def _add_one(t: Any) -> Any:
    return t.add_(1)


def test_an_op_that_fails_here_is_left_to_the_ranks_to_name(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    out = model(torch.arange(8).reshape(4, 2))
    picked = out.flatten()[torch.tensor([0, 99])]  # out of range: shapes alone do not say so
    with pytest.raises(RemoteTensorError, match="index"):
        picked.tolist()


@pytest.mark.usefixtures("steps_as_batches")
def test_a_hugging_face_step_reads_its_mask_without_a_round_trip(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPT-2's mask code asks whether the attention mask is all ones, in an `if`, twice a step:
    # each a round trip that cut the step (three messages a step). Now the step's only message
    # is its loss's read; the training itself is checked against one process in
    # test_real_models.py.
    monkeypatch.setattr(stream_mod, "BATCH_OPS", 10_000)  # a step's ~280 ops in one batch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    model = module_to_mesh(GPT2LMHeadModel(config), mesh)
    ids = torch.randint(1, 64, (4, 8))
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[0, 5:] = 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sent = []
    for _ in range(3):
        before = _sent(mesh)
        optimizer.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        optimizer.step()
        loss.item()
        sent.append(_sent(mesh) - before)
    assert sent[1:] == [1, 1], sent


class _Bumper(am.Actor):
    @am.endpoint
    def bump(self, t: torch.Tensor) -> None:
        t.add_(100)  # the rank's own value of the MeshTensor, written in place


@pytest.mark.usefixtures("steps_as_batches")
def test_an_op_on_known_values_is_computed_as_its_arguments_were_sent(mesh: Any) -> None:
    # Known values are computed when a read needs them, long after the op was recorded: a
    # controller tensor it read may have changed since, even behind its version counter.
    import numpy as np

    model = module_to_mesh(Ids(), mesh)
    out = model(torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]]))
    buffer = np.array([10, 20], dtype=np.int64)
    offset = torch.from_numpy(buffer)
    shifted = out + offset
    big = torch.zeros(1 << 17, dtype=torch.long)  # past known.LIMIT: the op is computed at once
    picked = big[out.flatten()]
    offset += 1  # in place: the ranks were sent it as it was
    buffer[:] = 1000  # and again through numpy, which moves no version counter
    big.fill_(5)
    assert _read_here(mesh, shifted) == [[11, 22], [13, 24], [15, 26], [17, 28]]
    assert _read_here(mesh, picked) == [0] * 8
    assert _from_ranks(shifted).tolist() == [[11, 22], [13, 24], [15, 26], [17, 28]]


@pytest.mark.usefixtures("steps_as_batches")
def test_a_long_chain_of_ops_on_known_values_is_read_without_a_round_trip(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    ids = torch.arange(8).reshape(4, 2)
    x = model(ids)
    for _ in range(300):  # longer than any chain left to compute at the read (known.DEFERRED)
        x = x + 1
    assert _read_here(mesh, x.sum()) == int(ids.sum()) + 300 * 8
    assert _from_ranks(x).tolist() == (ids + 300).tolist()


def test_an_actor_handed_a_known_value_may_write_it(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    out = model(torch.tensor([[1, 2], [3, 4]]))
    bumper = mesh.spawn("bumper", _Bumper)
    bumper.bump.call(out).get(timeout=60)
    assert out.tolist() == _from_ranks(out).tolist() == [[101, 102], [103, 104]]


def test_a_batch_changed_behind_its_version_counter_is_known_as_sent(mesh: Any) -> None:
    import numpy as np

    model = module_to_mesh(Ids(), mesh)
    buffer = np.zeros((4, 2), dtype=np.int64)
    ids = torch.from_numpy(buffer)  # a loader's buffer, written through numpy
    model(ids)
    buffer[:] = 7  # ids._version does not move: the ranks keep what they were sent
    out = model(ids)
    assert torch.equal(out.get(), _from_ranks(out))


def test_a_remote_call_writing_a_models_input_makes_it_unknown(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    ids = torch.tensor([[1, 2], [3, 4]])
    _add_one(model(ids))
    again = model(ids)
    assert torch.equal(again.get(), _from_ranks(again))


def test_ops_the_ranks_have_no_rule_for_are_never_known(mesh: Any) -> None:
    model = module_to_mesh(Ids(), mesh)
    x = model(torch.arange(24).reshape(4, 6))
    for value in (
        x.unfold(1, 2, 1),
        x[:, ::2].as_strided((3,), (1,)),  # (here: [0, 2, 4], of a copy; in one process [0, 1, 2])
        torch.nonzero_static(x, size=3),
    ):
        with pytest.raises(RemoteTensorError):
            value.get()
