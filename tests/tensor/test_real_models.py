"""Real models from the libraries their users have, trained from the controller as their users
train them, in every mode, equal to one process step by step (float64, differential.py):
Hugging Face ``GPT2LMHeadModel`` (tied embeddings) and ``LlamaForCausalLM`` from tiny configs
(no weights are downloaded), called as ``model(input_ids, attention_mask=..., labels=...).loss``
with AdamW and ``clip_grad_norm_``, and greedy ``generate`` giving the local model's tokens;
torch's ``nn.TransformerEncoder``. (torchvision's resnet18: test_resnet18.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from differential import compare_training
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from actormesh.tensor import inspect, module_to_mesh

VOCAB = 64

GPT2_PLAN = {  # GPT-2's blocks are HF Conv1D, which torch's styles do not take: its Linear ones
    "transformer.wte": RowwiseParallel(input_layouts=Replicate()),
    "lm_head": ColwiseParallel(output_layouts=Replicate()),
}
LLAMA_PLAN = {  # as TorchTitan and HF's base_model_tp_plan shard Llama
    "model.layers.*.input_layernorm": SequenceParallel(),
    "model.layers.*.self_attn.q_proj": ColwiseParallel(),
    "model.layers.*.self_attn.k_proj": ColwiseParallel(),
    "model.layers.*.self_attn.v_proj": ColwiseParallel(),
    "model.layers.*.self_attn.o_proj": RowwiseParallel(),
    "model.layers.*.mlp.gate_proj": ColwiseParallel(),
    "model.layers.*.mlp.up_proj": ColwiseParallel(),
    "model.layers.*.mlp.down_proj": RowwiseParallel(),
}


def modes(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        "default": {},
        "fsdp": {"fsdp": True},
        "tp_plan": {"tp_plan": plan},
        "fsdp+tp_plan": {"fsdp": True, "tp_plan": plan},
    }


def gpt2(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=dropout,
        embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).double()


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config).double()


def token_batches(steps: int = 2) -> list[dict[str, torch.Tensor]]:
    """Right-padded batches: the ranks' shares of counted tokens differ."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        ids = torch.randint(1, VOCAB, (4, 8), generator=generator)
        mask = torch.ones(4, 8, dtype=torch.long)
        mask[0, 5:] = 0
        mask[3, 2:] = 0
        labels = ids.masked_fill(mask == 0, -100)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def again(batches: list[Any]) -> list[Any]:
    """Two batches, then the first again: its loss must have gone down."""
    return [batches[0], batches[1], batches[0]]


# Hugging Face computes a causal LM's loss in float32 (loss_utils: ``logits.float()``), so its
# losses and gradients carry float32 rounding, the same on the mesh and locally up to the order
# of the sums: 1e-7 is far above that (1e-9 seen) and far below any wrong number seen (1e-3).
# AdamW then divides each gradient by its own size, so an element whose gradient is near zero
# moves by up to lr whatever its rounding: the weights after 3 steps get 1e-5 (7e-7 seen).
HF_ATOL, HF_WEIGHTS_ATOL = 1e-7, 1e-5


def lm_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(
        batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
    ).loss


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(modes(GPT2_PLAN)))
def test_gpt2_trains_as_in_one_process(mesh: Any, mode: str) -> None:
    losses = compare_training(
        gpt2, mesh, modes(GPT2_PLAN)[mode], again(token_batches()), lm_loss, atol=HF_ATOL,
        weights_atol=HF_WEIGHTS_ATOL,
    )  # fmt: skip
    assert losses[2] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(modes(LLAMA_PLAN)))
def test_llama_trains_as_in_one_process(mesh: Any, mode: str) -> None:
    losses = compare_training(
        llama, mesh, modes(LLAMA_PLAN)[mode], again(token_batches()), lm_loss, atol=HF_ATOL,
        weights_atol=HF_WEIGHTS_ATOL,
    )  # fmt: skip
    assert losses[2] < losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_generate_gives_the_local_models_tokens(mesh: Any, make: Any) -> None:
    local = make()
    model = module_to_mesh(copy.deepcopy(local), mesh)
    assert model.lm_head.weight is (
        model.transformer.wte.weight if make is gpt2 else model.lm_head.weight
    )
    prompt = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(prompt)
    kwargs = {"max_new_tokens": 4, "do_sample": False, "attention_mask": mask}
    want = local.generate(prompt, **kwargs)
    got = model.generate(prompt, **kwargs)  # runs here; its ops on the mesh
    assert torch.equal(inspect(got), want)


@pytest.mark.slow
def test_generate_in_train_mode_with_dropout(mesh: Any) -> None:
    # Dropout draws on the ranks (no one process draws the same numbers), so the tokens are
    # not compared; before, a pointwise result on the shards had the wrong strides and
    # attention's reshape of it failed on the ranks (test_tensor_recording.py).
    local = gpt2(dropout=0.1)
    model = module_to_mesh(copy.deepcopy(local), mesh)
    local.train()
    model.train()
    prompt = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    kwargs = {"max_new_tokens": 4, "do_sample": False, "attention_mask": torch.ones_like(prompt)}
    want = local.generate(prompt, **kwargs)
    got = inspect(model.generate(prompt, **kwargs))
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got[:, :4], prompt) and bool(((got >= 0) & (got < VOCAB)).all())


ENCODER_PLAN = {
    "encoder.layers.*.linear1": ColwiseParallel(),
    "encoder.layers.*.linear2": RowwiseParallel(),
}


class Encoder(nn.Module):
    """nn.TransformerEncoder with a classifier, on (batch, sequence, features)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(x, src_key_padding_mask=padding).mean(1))


def encoder() -> nn.Module:
    torch.manual_seed(0)
    return Encoder().double()


def encoder_batches(steps: int = 2) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        x = torch.randn(6, 5, 16, generator=generator, dtype=torch.float64)
        padding = torch.zeros(6, 5, dtype=torch.bool)
        padding[1, 3:] = True
        out.append((x, padding, torch.randint(0, 3, (6,), generator=generator)))
    return out


def encoder_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, padding, target = batch
    return nn.functional.cross_entropy(model(x, padding), target)


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(modes(ENCODER_PLAN)))
def test_transformer_encoder_trains_as_in_one_process(mesh: Any, mode: str) -> None:
    losses = compare_training(
        encoder, mesh, modes(ENCODER_PLAN)[mode], again(encoder_batches()), encoder_loss
    )
    assert losses[2] < losses[0]


@pytest.mark.parametrize("mode", ["default", "tp_plan"])
def test_transformer_encoder_in_eval_mode(mesh: Any, mode: str) -> None:
    # Eval without grad takes torch's fused encoder path (one op for a layer), which DTensor
    # has no rule for: it runs on each rank's rows (worker/shard_ops.py).
    local = encoder()
    model = module_to_mesh(copy.deepcopy(local), mesh, **modes(ENCODER_PLAN)[mode])
    model.eval()
    local.eval()
    x, padding, _ = encoder_batches(1)[0]
    with torch.no_grad():
        assert torch.allclose(inspect(model(x, padding)), local(x, padding), atol=1e-10)
