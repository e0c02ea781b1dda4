r"""Recurrent cells: one time step of an Elman RNN, an LSTM and a GRU, written out in full.

Each cell is equal to its torch.nn counterpart (:class:`torch.nn.RNNCell`,
:class:`torch.nn.LSTMCell`, :class:`torch.nn.GRUCell`): same parameter names and shapes, same
gate order inside the stacked weights, same initialisation, same outputs. The multi-layer
sequence layers in :mod:`layerlab.layers.recurrent` use exactly these step equations.

Dimension letters used in this module:

    B   batch size (absent for unbatched input)
    I   input features (``input_size``)
    H   hidden features (``hidden_size``)
    G   number of gates stacked in one weight: 1 (RNN), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n)
"""

from __future__ import annotations

from typing import Optional, Tuple

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
    one_of,
    positive_int,
    quiet_when_tracing,
    shape_str,
    uniform_init,
)

__all__ = ["RNNCell", "LSTMCell", "GRUCell"]


class _CellBase(TorchTwin, nn.Module):
    """Parameters, initialisation, input checks and weight copying common to the three cells.

    Subclasses set ``num_gates`` (G) and the torch class they mirror, and write ``forward``.
    """

    num_gates: int = 1
    _torch_cls: type = nn.RNNCellBase

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        self.input_size = positive_int(name, "input_size", input_size)
        self.hidden_size = positive_int(name, "hidden_size", hidden_size)
        self.bias = bias
        factory = {"device": device, "dtype": dtype}
        G, H, I = self.num_gates, hidden_size, input_size
        self.weight_ih = nn.Parameter(torch.empty(G * H, I, **factory))  # (G·H, I)
        self.weight_hh = nn.Parameter(torch.empty(G * H, H, **factory))  # (G·H, H)
        if bias:
            self.bias_ih = nn.Parameter(torch.empty(G * H, **factory))  # (G·H,)
            self.bias_hh = nn.Parameter(torch.empty(G * H, **factory))  # (G·H,)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(−1/√H, 1/√H), as torch.nn does for all recurrent layers."""
        uniform_init(self, self.hidden_size)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + non_defaults(self, {"bias": True, "nonlinearity": "tanh"})

    # ---- checks ------------------------------------------------------------------------------

    @quiet_when_tracing
    def _check_input(self, input: Tensor) -> bool:
        """Validate ``input``; return whether it is batched."""
        name = type(self).__name__
        check_tensor(name, "input", input)
        check_dim(name, "input", input, (1, 2), "2-D [B, I] or 1-D [I] (unbatched)")
        check_features(name, input, self.input_size)
        check_float_dtype(name, "input", input, self.weight_ih.dtype)
        return input.dim() == 2

    @quiet_when_tracing
    def _check_state(self, state: Tensor, label: str, input: Tensor, batched: bool) -> Tensor:
        """Validate one state tensor against the input; return it with a batch dim."""
        name = type(self).__name__
        check_tensor(name, label, state)
        if batched:
            want, layout = [input.shape[0], self.hidden_size], "[B, H]"
        else:
            want, layout = [self.hidden_size], "[H] (the input is unbatched)"
        if list(state.shape) != want:
            raise input_error(
                name, f"{label} shape", f"{shape_str(want)} = {layout}", shape_str(state.shape),
                f"pass {label} of shape {shape_str(want)}",
                context=f"input shape {shape_str(input.shape)}",
            )
        check_float_dtype(name, label, state, self.weight_ih.dtype)
        return state if batched else state.unsqueeze(0)

    def _zeros(self, x: Tensor) -> Tensor:
        return x.new_zeros(x.shape[0], self.hidden_size)  # (B, H)

    # ---- weights to and from torch.nn (from_torch / to_torch: TorchTwin) ---------------------

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        """Constructor arguments, which are also attribute names on ours and on torch's cell."""
        return ("input_size", "hidden_size", "bias")


class RNNCell(_CellBase):
    r"""An Elman RNN cell with tanh or ReLU non-linearity.

    .. math::

        h' = \tanh(W_{ih} x + b_{ih} + W_{hh} h + b_{hh})

    With ``nonlinearity='relu'``, ReLU replaces tanh.

    Args:
        input_size (int): number of features of the input ``x`` (I).
        hidden_size (int): number of features of the hidden state ``h`` (H).
        bias (bool, optional): if ``False``, the cell has no ``bias_ih`` / ``bias_hh``. Default: ``True``
        nonlinearity (str, optional): ``'tanh'`` or ``'relu'``. Default: ``'tanh'``

    Shape:
        - input: :math:`(B, I)` or :math:`(I)` (unbatched).
        - hx: :math:`(B, H)` or :math:`(H)`; zeros when not given.
        - output: :math:`(B, H)` or :math:`(H)`, the next hidden state.

        where:
            B = batch size, I = input_size, H = hidden_size

    Attributes:
        weight_ih: :math:`(H, I)`, ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`
        weight_hh: :math:`(H, H)`, same distribution
        bias_ih: :math:`(H)`, same distribution
        bias_hh: :math:`(H)`, same distribution

    Examples::

        >>> cell = RNNCell(10, 20)
        >>> x, h = torch.randn(6, 3, 10), torch.zeros(3, 20)
        >>> outputs = []
        >>> for t in range(6):
        ...     h = cell(x[t], h)
        ...     outputs.append(h)
    """

    num_gates = 1
    _torch_cls = nn.RNNCell

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None) -> None:
        one_of("RNNCell", "nonlinearity", nonlinearity, ("tanh", "relu"))
        super().__init__(input_size, hidden_size, bias, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        return super()._config_keys() + ("nonlinearity",)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(0)  # (B, I)
        h = self._zeros(x) if hx is None else self._check_state(hx, "hx", input, batched)  # (B, H)
        pre = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)  # (B, H)
        h_next = torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre)
        return h_next if batched else h_next.squeeze(0)


class LSTMCell(_CellBase):
    r"""A long short-term memory (LSTM) cell.

    .. math::

        \begin{array}{ll}
        i = \sigma(W_{ii} x + b_{ii} + W_{hi} h + b_{hi}) \\
        f = \sigma(W_{if} x + b_{if} + W_{hf} h + b_{hf}) \\
        g = \tanh(W_{ig} x + b_{ig} + W_{hg} h + b_{hg}) \\
        o = \sigma(W_{io} x + b_{io} + W_{ho} h + b_{ho}) \\
        c' = f \odot c + i \odot g \\
        h' = o \odot \tanh(c')
        \end{array}

    The four gates are stacked in one weight in torch's order **i, f, g, o** (input, forget,
    cell candidate, output), so one matmul computes all of them: row block ``k·H:(k+1)·H`` of
    ``weight_ih`` / ``weight_hh`` / the biases belongs to gate ``k``.

    Args:
        input_size (int): number of features of the input ``x`` (I).
        hidden_size (int): number of features of ``h`` and ``c`` (H).
        bias (bool, optional): if ``False``, the cell has no ``bias_ih`` / ``bias_hh``. Default: ``True``

    Shape:
        - input: :math:`(B, I)` or :math:`(I)` (unbatched).
        - hx: a tuple ``(h, c)``, each :math:`(B, H)` or :math:`(H)`; zeros when not given.
        - output: a tuple ``(h', c')``, each :math:`(B, H)` or :math:`(H)`.

        where:
            B = batch size, I = input_size, H = hidden_size

    Attributes:
        weight_ih: :math:`(4H, I)`, rows ``[W_ii | W_if | W_ig | W_io]``,
            ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`
        weight_hh: :math:`(4H, H)`, rows ``[W_hi | W_hf | W_hg | W_ho]``, same distribution
        bias_ih: :math:`(4H)`, same distribution
        bias_hh: :math:`(4H)`, same distribution
    """

    num_gates = 4
    _torch_cls = nn.LSTMCell

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(0)  # (B, I)
        if hx is None:
            h, c = self._zeros(x), self._zeros(x)  # (B, H) each
        else:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise input_error("LSTMCell", "hx", "a tuple (h, c)", type(hx).__name__,
                                  "pass hx=(h, c) with two tensors")
            h = self._check_state(hx[0], "h", input, batched)
            c = self._check_state(hx[1], "c", input, batched)
        gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)  # (B, 4H)
        i, f, g, o = gates.chunk(4, dim=1)  # (B, H) each, torch's order
        c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (B, H)
        h_next = torch.sigmoid(o) * torch.tanh(c_next)  # (B, H)
        if not batched:
            return h_next.squeeze(0), c_next.squeeze(0)
        return h_next, c_next


class GRUCell(_CellBase):
    r"""A gated recurrent unit (GRU) cell.

    .. math::

        \begin{array}{ll}
        r = \sigma(W_{ir} x + b_{ir} + W_{hr} h + b_{hr}) \\
        z = \sigma(W_{iz} x + b_{iz} + W_{hz} h + b_{hz}) \\
        n = \tanh(W_{in} x + b_{in} + r \odot (W_{hn} h + b_{hn})) \\
        h' = (1 - z) \odot n + z \odot h
        \end{array}

    Gates are stacked in torch's order **r, z, n** (reset, update, new). Note where the reset
    gate acts: it multiplies ``W_hn h + b_hn`` *including its bias*, so ``b_hn`` cannot be
    folded into ``b_in`` (the two biases of the other gates could be). This is the cuDNN
    variant torch implements; the original paper applies ``r`` to ``h`` before the matmul.

    Args:
        input_size (int): number of features of the input ``x`` (I).
        hidden_size (int): number of features of ``h`` (H).
        bias (bool, optional): if ``False``, the cell has no ``bias_ih`` / ``bias_hh``. Default: ``True``

    Shape:
        - input: :math:`(B, I)` or :math:`(I)` (unbatched).
        - hx: :math:`(B, H)` or :math:`(H)`; zeros when not given.
        - output: :math:`(B, H)` or :math:`(H)`, the next hidden state.

        where:
            B = batch size, I = input_size, H = hidden_size

    Attributes:
        weight_ih: :math:`(3H, I)`, rows ``[W_ir | W_iz | W_in]``,
            ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`
        weight_hh: :math:`(3H, H)`, rows ``[W_hr | W_hz | W_hn]``, same distribution
        bias_ih: :math:`(3H)`, same distribution
        bias_hh: :math:`(3H)`, same distribution
    """

    num_gates = 3
    _torch_cls = nn.GRUCell

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(0)  # (B, I)
        h = self._zeros(x) if hx is None else self._check_state(hx, "hx", input, batched)  # (B, H)
        xr, xz, xn = F.linear(x, self.weight_ih, self.bias_ih).chunk(3, dim=1)  # (B, H) each
        hr, hz, hn = F.linear(h, self.weight_hh, self.bias_hh).chunk(3, dim=1)  # (B, H) each
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)  # r scales W_hn h + b_hn, bias included
        h_next = (1 - z) * n + z * h  # (B, H)
        return h_next if batched else h_next.squeeze(0)
