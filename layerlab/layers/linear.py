"""Linear: ``y = x Wᵀ + b`` over the last dim, with torch's default init written out.

The most common shape bug in a model is a Linear after a flatten whose ``in_features`` was
computed for another input size. The check here says which number to put where:
``Linear: input: expects last dim = in_features = 100, got 7200 → set in_features=7200``.

Legend for the shape comments: * any leading dims · H_in = in_features · H_out = out_features.
"""

from __future__ import annotations

import math
from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._checks import (
    LayerInputError, check_matches, check_type, checking, copy_params, default_init, positive_int,
)

__all__ = ["Linear"]


class Linear(nn.Module):
    r"""Applies ``y = x Wᵀ + b`` to the last dim; equal to :class:`torch.nn.Linear`.

    Written as ``F.linear(x, weight, bias)`` (one fused matmul-add, the op ``nn.Linear`` calls).
    A reference loop, for one input vector ``x`` of length ``H_in``::

        y = [bias[j] + sum(weight[j][i] * x[i] for i in range(H_in)) for j in range(H_out)]

    Args:
        in_features (int): Size ``H_in`` of each input's last dim.
        out_features (int): Size ``H_out`` of each output's last dim.
        bias (bool, optional): If ``False``, no additive bias. Default: ``True``

    Attributes:
        weight (Tensor): ``(H_out, H_in)``, initialised from ``U(−1/√H_in, 1/√H_in)``: torch's
            ``kaiming_uniform_(a=√5)``, whose bound ``√3 · √(2/(1 + a²)) / √fan_in`` is ``1/√fan_in``
            for ``a = √5``, with ``fan_in = H_in`` (see :meth:`reset_parameters`).
        bias (Tensor or None): ``(H_out,)``, from ``U(−1/√H_in, 1/√H_in)``.

    Shape:
        - Input: ``(*, H_in)``
        - Output: ``(*, H_out)``

          where ``*`` is any number of leading dims (including none), kept as they are.

    Example::

        >>> fc = Linear(20, 30)
        >>> fc(torch.randn(128, 20)).shape
        torch.Size([128, 30])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = positive_int("Linear", "in_features", in_features)
        self.out_features = positive_int("Linear", "out_features", out_features)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory))  # (H_out, H_in)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))  # (H_out,)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's default init, same RNG calls in the same order as ``nn.Linear``."""
        default_init(self.weight, self.bias, self.in_features)

    def forward(self, input: Tensor) -> Tensor:
        if not torch.jit.is_scripting():  # the script compiler skips this branch
            if checking():
                self._check(input)
        return F.linear(input, self.weight, self.bias)  # (*, H_out)

    def _check(self, input: Tensor) -> None:
        if not isinstance(input, Tensor) or input.dim() == 0 or input.shape[-1] != self.in_features:
            got = "a scalar" if isinstance(input, Tensor) and input.dim() == 0 else (
                input.shape[-1] if isinstance(input, Tensor) else type(input).__name__)
            shape = f" (input shape {tuple(input.shape)})" if isinstance(input, Tensor) else ""
            hint = (f"set in_features={got}" if isinstance(got, int)
                    else "pass a tensor whose last dim holds the features")
            if isinstance(input, Tensor) and input.dim() > 2 and math.prod(input.shape[1:]) == self.in_features:
                hint = f"flatten the features first: x.flatten(1) gives {(input.shape[0], self.in_features)}"
            raise LayerInputError(
                f"Linear: input: expects last dim = in_features = {self.in_features}, got {got}{shape} → {hint}",
                where="Linear.input", expected=self.in_features, got=got, hint=hint)
        check_matches("Linear", input, self.weight)

    @classmethod
    def from_torch(cls, module: nn.Linear) -> "Linear":
        """A Linear with ``module``'s sizes and a copy of its weights (same dtype, device)."""
        check_type(cls.__name__, module, nn.Linear)
        layer = cls(module.in_features, module.out_features, bias=module.bias is not None,
                    device=module.weight.device, dtype=module.weight.dtype)
        copy_params(layer, module, [(n, n) for n, _ in layer.named_parameters()])
        return layer

    def to_torch(self) -> nn.Linear:
        """``torch.nn.Linear`` with a copy of this layer's weights."""
        module = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        copy_params(module, self, [(n, n) for n, _ in module.named_parameters()])
        return module

    def _config(self) -> Dict:
        return {"in_features": self.in_features, "out_features": self.out_features}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
