r"""The machinery shared by :mod:`layerlab.layers.recurrent`'s RNN, LSTM and GRU.

Parameters in torch's names and order, their initialisation, the input/state checks, the loop
over layers and directions (with dropout between layers) and the weight copying to and from
torch.nn. A subclass only writes ``_scan``: one layer, one direction, the whole sequence.

Dimension letters used in this module (as in :mod:`layerlab.layers.recurrent`):

    T   sequence length
    B   batch size (absent for unbatched input)
    I   input features (``input_size``)
    H   hidden features (``hidden_size``); H_out = proj_size if > 0 else H
    L   number of stacked layers (``num_layers``)
    D   directions: 2 if ``bidirectional`` else 1
    G   gates stacked in one weight: 1 (RNN), 4 (LSTM), 3 (GRU)
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._seq_checks import (
    TorchTwin,
    check_dim,
    check_features,
    check_float_dtype,
    check_tensor,
    input_error,
    non_defaults,
    positive_int,
    probability,
    quiet_when_tracing,
    shape_str,
    uniform_init,
)

__all__ = ["RNNBase"]


class RNNBase(TorchTwin, nn.Module):
    """Parameters, checks, layer/direction plumbing and weight copying shared by RNN, LSTM, GRU.

    A subclass sets ``num_gates`` and ``_torch_cls`` and writes ``_scan``: one layer, one
    direction, over the whole sequence.
    """

    num_gates: int = 1
    _has_cell: bool = False  # True for the LSTM (a cell state c next to h)
    _torch_cls: type = nn.RNNBase
    _quiet_copy = True  # torch's RNNs warn about dropout with one layer too

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            positive_int(name, arg, value)
        dropout = probability(name, "dropout", dropout)
        if isinstance(proj_size, bool) or not isinstance(proj_size, int) or not 0 <= proj_size < hidden_size:
            raise input_error(name, "proj_size", f"0 (off) or an int in [1, hidden_size={hidden_size})",
                              repr(proj_size), "pass proj_size=0 or a size smaller than hidden_size")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{name}: dropout={dropout} has no effect with num_layers=1: dropout acts between "
                          "stacked layers, never after the last one", UserWarning, stacklevel=3)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size

        factory = {"device": device, "dtype": dtype}
        G, H, D = self.num_gates, hidden_size, self.num_directions
        H_out = self.output_hidden_size
        # Registration order = torch's: per layer, per direction: w_ih, w_hh, b_ih, b_hh, w_hr.
        self._weight_names: List[List[Tuple[str, ...]]] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else D * H_out
            per_direction = []
            for direction in range(D):
                sfx = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes = {f"weight_ih{sfx}": (G * H, layer_in), f"weight_hh{sfx}": (G * H, H_out)}
                if bias:
                    shapes.update({f"bias_ih{sfx}": (G * H,), f"bias_hh{sfx}": (G * H,)})
                if proj_size:
                    shapes[f"weight_hr{sfx}"] = (proj_size, H)
                for pname, shape in shapes.items():
                    self.register_parameter(pname, nn.Parameter(torch.empty(shape, **factory)))
                per_direction.append(tuple(shapes))
            self._weight_names.append(per_direction)
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_hidden_size(self) -> int:
        """H_out: the size of ``h`` (``proj_size`` for a projected LSTM, else ``hidden_size``)."""
        return self.proj_size if self.proj_size > 0 else self.hidden_size

    @property
    def all_weights(self) -> List[List[Tensor]]:
        """``[[w_ih, w_hh, b_ih, b_hh(, w_hr)] per layer·direction]``, like torch.nn's."""
        return [[getattr(self, n) for n in names] for per_dir in self._weight_names for names in per_dir]

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(−1/√H, 1/√H), as torch.nn does."""
        uniform_init(self, self.hidden_size)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + non_defaults(self, {
            "num_layers": 1, "bias": True, "batch_first": False, "dropout": 0.0, "bidirectional": False,
            "proj_size": 0, "nonlinearity": "tanh"})

    # ---- checks ------------------------------------------------------------------------------

    @quiet_when_tracing
    def _check_input(self, input: Tensor) -> bool:
        """Validate ``input``; return whether it is batched."""
        name = type(self).__name__
        check_tensor(name, "input", input)
        batched_layout = "[B, T, I] (batch_first=True)" if self.batch_first else "[T, B, I] (batch_first=False)"
        check_dim(name, "input", input, (2, 3), f"3-D {batched_layout} or 2-D [T, I] (unbatched)")
        check_features(name, input, self.input_size)
        check_float_dtype(name, "input", input, self._flat_dtype())
        batched = input.dim() == 3
        T = input.shape[1] if (batched and self.batch_first) else input.shape[0]
        if T == 0:
            raise input_error(name, "sequence length T", "≥ 1", 0, "pass at least one time step",
                              context=f"input shape {shape_str(input.shape)}")
        return batched

    @quiet_when_tracing
    def _check_state(self, state: Tensor, label: str, size: int, size_name: str, input: Tensor,
                     batch: int, batched: bool) -> Tensor:
        """Validate ``h0`` or ``c0``; return it as ``(L·D, B, size)``."""
        name = type(self).__name__
        check_tensor(name, label, state)
        LD = self.num_layers * self.num_directions
        if batched:
            want, layout = [LD, batch, size], f"[num_layers·D, B, {size_name}]"
        else:
            want, layout = [LD, size], f"[num_layers·D, {size_name}] (the input is unbatched)"
        if list(state.shape) != want:
            context = f"input shape {shape_str(input.shape)}"
            if self.batch_first and batched:
                context += f"; {label} keeps the batch in dim 1 even with batch_first=True"
            raise input_error(name, f"{label} shape", f"{shape_str(want)} = {layout}", shape_str(state.shape),
                              f"pass {label} of shape {shape_str(want)}", context=context)
        check_float_dtype(name, label, state, self._flat_dtype())
        return state if batched else state.unsqueeze(1)

    def _flat_dtype(self) -> torch.dtype:
        return self.weight_ih_l0.dtype

    def _batch_size(self, input: Tensor, batched: bool) -> int:
        return input.shape[0 if self.batch_first else 1] if batched else 1

    # ---- the forward pass --------------------------------------------------------------------

    def _forward_h(self, input: Tensor, hx: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """``forward`` of the layers whose state is ``h`` alone (RNN, GRU): ``output, h_n``."""
        batched = self._check_input(input)
        h0 = None
        if hx is not None:
            h0 = self._check_state(hx, "h0", self.hidden_size, "H", input, self._batch_size(input, batched), batched)
        output, h_n, _ = self._run(input, h0, None, batched)
        return output, h_n

    def _run(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor], batched: bool):
        """The layer/direction loop shared by all three; returns ``output, h_n, c_n (or None)``."""
        x = input if batched else input.unsqueeze(1)  # (T, B, I) or (B, T, I)
        if self.batch_first and batched:
            x = x.transpose(0, 1)  # (T, B, I): time-major inside
        B, D = x.shape[1], self.num_directions
        h_n: List[Tensor] = []
        c_n: List[Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(D):
                k = layer * D + direction
                w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, direction)
                h = h0[k] if h0 is not None else x.new_zeros(B, self.output_hidden_size)  # (B, H_out)
                c = None  # the LSTM's cell state; RNN and GRU have none
                if self._has_cell:
                    c = c0[k] if c0 is not None else x.new_zeros(B, self.hidden_size)  # (B, H)
                out, h, c = self._scan(x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=direction == 1)
                outputs.append(out)  # (T, B, H_out)
                h_n.append(h)
                c_n.append(c)
            x = outputs[0] if D == 1 else torch.cat(outputs, dim=2)  # (T, B, D·H_out)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)  # between layers, not after the last
        output = x.transpose(0, 1) if (self.batch_first and batched) else x
        hn = torch.stack(h_n)  # (L·D, B, H_out)
        cn = torch.stack(c_n) if self._has_cell else None  # (L·D, B, H)
        if not batched:
            output, hn = output.squeeze(1), hn.squeeze(1)
            cn = cn.squeeze(1) if cn is not None else None
        return output, hn, cn

    def _weights(self, layer: int, direction: int):
        names = self._weight_names[layer][direction]
        w_ih, w_hh = getattr(self, names[0]), getattr(self, names[1])
        b_ih = getattr(self, names[2]) if self.bias else None
        b_hh = getattr(self, names[3]) if self.bias else None
        w_hr = getattr(self, names[-1]) if self.proj_size else None
        return w_ih, w_hh, b_ih, b_hh, w_hr

    def _scan(self, x: Tensor, h: Tensor, c: Optional[Tensor], w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor],
              b_hh: Optional[Tensor], w_hr: Optional[Tensor], reverse: bool) -> Tuple[Tensor, Tensor, Tensor]:
        """One layer, one direction over all T steps: ``(output (T, B, H_out), h_T, c_T or None)``."""
        raise NotImplementedError

    @staticmethod
    def _time_order(T: int, reverse: bool) -> range:
        return range(T - 1, -1, -1) if reverse else range(T)

    # ---- weights to and from torch.nn (from_torch / to_torch: TorchTwin) ---------------------

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        """Constructor arguments, which are also attribute names on ours and on torch's layer."""
        return ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")
