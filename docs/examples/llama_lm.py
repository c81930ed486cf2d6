"""A Llama-style causal LM from transformers, built from a config in code (two layers, random weights,
no download), for `h3bench model docs/examples/llama_lm.py:build`: four sequences of six tokens, each
sequence a row. `build_split_k` is the same model with one batch-variant matrix product planted in layer
1's MLP (`SplitKLinear`: above 16 rows it sums the product in two halves of K, as a GEMM library's split-K
kernel does), so `h3bench model` has something to name on any CPU."""
from __future__ import annotations

import torch
from torch import nn

SPLIT_FROM_ROWS = 16


@torch.library.custom_op("h3demo::split_k_linear", mutates_args=())
def split_k_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.shape[0] < SPLIT_FROM_ROWS:
        return x @ weight.t()
    half = x.shape[1] // 2
    return x[:, :half] @ weight[:, :half].t() + x[:, half:] @ weight[:, half:].t()


@split_k_linear.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    return grad @ weight, grad.t() @ x


split_k_linear.register_autograd(_backward, setup_context=_setup)


class SplitKLinear(nn.Linear):
    """nn.Linear through `h3demo::split_k_linear` on the flattened tokens."""

    def forward(self, x):
        return split_k_linear(x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


def build(device):
    from transformers import LlamaConfig, LlamaForCausalLM  # the `transformers` extra

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device).eval()
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, config.vocab_size, (4, 6), generator=gen).to(device)
    return model, {"input_ids": input_ids}, ["input_ids"]


def build_split_k(device):
    model, examples, per_row = build(device)
    mlp = model.model.layers[1].mlp
    planted = SplitKLinear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False).to(device)
    planted.weight = mlp.down_proj.weight
    mlp.down_proj = planted
    return model, examples, per_row
