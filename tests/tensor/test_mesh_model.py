"""The model module_to_mesh gives back is the user's model (issue 38): tied parameters stay tied
(instance or factory), its class, attributes and methods work, state_dict keeps the original
keys, and forward takes and returns whatever the model's forward does. Each value is compared
with the same model run locally (float64)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from training import Config, TiedLM

from actormesh.errors import MeshUsageError
from actormesh.tensor import MeshModule, MeshTensor, fetch, inspect, module_to_mesh

WAIT = 60


def _tied(seed: int = 0) -> TiedLM:
    torch.manual_seed(seed)
    return TiedLM(Config()).double()


@pytest.mark.parametrize("form", ["instance", "factory"])
def test_tied_parameters_stay_tied(mesh: Any, form: str) -> None:
    local = _tied()
    # Before issue 38 the instance form failed here: "module_build gave 9 results where the
    # controller expected 10" (the controller's copy had untied the head from the embedding).
    source = copy.deepcopy(local) if form == "instance" else _tied
    model = module_to_mesh(source, mesh)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in local.named_parameters()]
    assert model.head.weight is model.wte.weight
    assert len(list(model.parameters())) == len(list(local.parameters()))
    weights = inspect(dict(model.state_dict()))
    for name, value in local.state_dict().items():
        assert torch.equal(weights[name], value), name  # the factory's seed gives the same
    # A step: the tied weight's gradient is the sum of both uses, as locally.
    idx = torch.randint(0, 16, (4, 6))
    targets = torch.randint(0, 16, (4, 6))
    targets[0, 3:] = -1  # ignored: the ranks' counts of targets differ
    for m in (model, local):
        m.configure_optimizers()  # the user's own method
        _, loss = m(idx, targets)
        loss.backward()
    assert torch.allclose(inspect(model.wte.weight.grad), local.wte.weight.grad, atol=1e-12)


def test_the_meshed_model_is_the_users_model(mesh: Any) -> None:
    local = _tied()
    model = module_to_mesh(copy.deepcopy(local), mesh)
    assert isinstance(model, TiedLM) and isinstance(model, MeshModule)
    assert type(model).__name__ == "MeshTiedLM"
    assert model.config.vocab == 16  # an attribute of the user's class
    assert all(
        isinstance(p, MeshTensor) and isinstance(p, nn.Parameter) for p in model.parameters()
    )
    optimizer = model.configure_optimizers()  # a method of the user's class
    assert isinstance(optimizer, torch.optim.AdamW)
    prompt = torch.randint(0, 16, (2, 3))
    # generate() runs here, on the controller; its ops (argmax, cat) on the mesh.
    assert torch.equal(inspect(model.generate(prompt, 4)), local.generate(prompt, 4))
    assert list(model.state_dict()) == list(local.state_dict())
    # load_state_dict with a local state dict writes into the mesh's parameters.
    other = _tied(seed=1)
    model.load_state_dict(other.state_dict())
    assert model.head.weight is model.wte.weight
    fetched = model.fetch_module()
    assert type(fetched) is TiedLM
    for name, value in other.state_dict().items():
        assert torch.equal(fetched.state_dict()[name], value), name
    assert fetched.head.weight is fetched.wte.weight


def test_converting_a_meshed_model_is_refused(mesh: Any) -> None:
    model = module_to_mesh(nn.Linear(4, 4), mesh)
    with pytest.raises(MeshUsageError, match="convert the module before module_to_mesh"):
        model.double()
    with pytest.raises(MeshUsageError, match="requires grad"):
        model(torch.randn(2, 4, requires_grad=True))
    with pytest.raises(MeshUsageError, match="already on a mesh"):
        module_to_mesh(model, mesh)


@dataclasses.dataclass
class Out:
    scores: torch.Tensor
    extra: dict[str, Any]
    nothing: None = None


class ManyInputs(nn.Module):
    """A forward with positional and keyword tensors, None, scalars and nested containers, that
    returns a dataclass of tensors, dicts, tuples, None and Python numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(
        self,
        x: torch.Tensor,
        pair: tuple[torch.Tensor, torch.Tensor],
        *,
        mask: torch.Tensor | None = None,
        scale: float = 1.0,
        extra: dict[str, Any] | None = None,
    ) -> Out:
        h = self.fc(x + pair[0] * pair[1]) * scale
        if mask is not None:
            h = h.masked_fill(~mask[:, None], 0.0)
        counts = {"rows": x.shape[0], "sum": h.sum(), "ids": (extra or {}).get("ids")}
        return Out(h, {"counts": counts, "pair": (h.mean(0), None)})


def test_forward_takes_and_returns_what_the_model_does(mesh: Any) -> None:
    torch.manual_seed(0)
    local = ManyInputs().double()
    model = module_to_mesh(copy.deepcopy(local), mesh)
    x, a, b = (torch.randn(5, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([True, False, True, True, False])
    ids = torch.arange(5)
    args = (x, (a, b))
    kwargs: dict[str, Any] = {"mask": mask, "scale": 2.0, "extra": {"ids": ids}}
    got, want = model(*args, **kwargs), local(*args, **kwargs)
    assert isinstance(got, Out) and got.nothing is None
    assert isinstance(got.scores, MeshTensor) and got.scores.shape == (5, 3)
    assert got.scores.dtype == torch.float64
    assert got.extra["counts"]["rows"] == 5 and got.extra["pair"][1] is None
    # The batch was split over dp: outputs keep its rows split; reductions are whole.
    assert [type(p).__name__ for p in got.scores.placements().get(timeout=WAIT)] == [
        "Shard",
        "Replicate",
    ]
    fetched = fetch(vars(got)).get(timeout=WAIT)  # (asdict would deep-copy the tensors)
    expected = vars(want)
    assert torch.allclose(fetched["scores"], expected["scores"])
    assert torch.allclose(fetched["extra"]["counts"]["sum"], expected["extra"]["counts"]["sum"])
    assert torch.equal(fetched["extra"]["counts"]["ids"], ids)
    assert torch.allclose(fetched["extra"]["pair"][0], expected["extra"]["pair"][0])
    # No tensors at all, and a forward that returns None.
    assert module_to_mesh(nn.Identity(), mesh)(None) is None


def test_a_loss_inside_forward_counts_every_rank_s_targets(mesh: Any) -> None:
    # cross_entropy's mean over a batch split over dp, with ignored targets unevenly spread:
    # DTensor's own rule averaged the ranks' means (4.18542 where one process gives 4.18422 on
    # GPT-2), and the gradients were right, so nothing failed loudly.
    local = _tied()
    model = module_to_mesh(copy.deepcopy(local), mesh)
    idx = torch.randint(0, 16, (4, 6))
    targets = torch.randint(0, 16, (4, 6))
    targets[0, 1:] = -1
    targets[1, 4:] = -1
    assert inspect(model(idx, targets)[1]).item() == pytest.approx(
        local(idx, targets)[1].item(), abs=1e-12
    )


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def test_buffers_and_train_eval_as_in_one_process(mesh: Any) -> None:
    # BatchNorm's batch statistics are over the whole batch (split over dp on the ranks), its
    # running statistics and num_batches_tracked update as locally, and eval() uses them.
    torch.manual_seed(0)
    local = Norms().double()
    model = module_to_mesh(copy.deepcopy(local), mesh)
    batches = [torch.randn(6, 2, 5, 5, dtype=torch.float64) for _ in range(3)]
    for x in batches:
        assert torch.allclose(inspect(model(x)), local(x).detach(), atol=1e-10)
    buffers = inspect(dict(model.named_buffers()))
    for name, value in local.named_buffers():
        assert torch.allclose(buffers[name], value, atol=1e-12), name
    assert buffers["bn.num_batches_tracked"].item() == 3
    model.eval()
    local.eval()
    assert not model.bn.training
    with torch.no_grad():
        assert torch.allclose(inspect(model(batches[0])), local(batches[0]), atol=1e-10)
    assert torch.allclose(inspect(model.bn.running_mean), local.bn.running_mean, atol=1e-12)
