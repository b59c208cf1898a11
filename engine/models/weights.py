"""Copying a Hugging Face state dict into one of our models (nanoGPT `from_pretrained`, vLLM's
`load_weights`): the names are HF's, so it is a checked 1:1 copy."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn


@torch.no_grad()
def copy_hf_weights(
    model: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    arch: str,
    transform: Callable[[str, torch.Tensor], torch.Tensor] = lambda name, tensor: tensor,
    ignored: Callable[[str], bool] = lambda name: False,
) -> None:
    """Copy every parameter of `model` from `state_dict` (through `transform(name, tensor)`);
    dtype and device follow the model. A missing weight, a shape mismatch or a weight the model
    does not know (unless `ignored`, or a tied model's lm_head) is a one-line ValueError."""
    own = model.state_dict()
    missing = [name for name in own if name not in state_dict]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} {arch} weights, e.g. {missing[:3]}")
    for name, param in own.items():
        src = transform(name, state_dict[name])
        if src.shape != param.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} != model {tuple(param.shape)}")
        param.copy_(src)
    tied = getattr(model, "lm_head", None) is None
    unexpected = [k for k in state_dict if k not in own and not ignored(k) and not (k == "lm_head.weight" and tied)]
    if unexpected:
        raise ValueError(f"checkpoint has weights this {arch} does not know, e.g. {unexpected[:3]}")


def build_empty(cls: type[nn.Module], config, device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    """`cls(config)` on `device` in `dtype` with uninitialised parameters (every one is copied
    over next: no random init)."""
    with torch.device("meta"):
        model = cls(config).to(dtype=dtype)
    return model.to_empty(device=device)
