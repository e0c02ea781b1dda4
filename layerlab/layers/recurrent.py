r"""Multi-layer recurrent layers: RNN, LSTM and GRU over whole sequences, written out in full.

Each class is equal to its torch.nn counterpart (:class:`torch.nn.RNN`, :class:`torch.nn.LSTM`,
:class:`torch.nn.GRU`): same constructor arguments, same parameter names (``weight_ih_l0``,
``weight_hh_l1_reverse``, …) and shapes, same initialisation, same outputs, including the
layouts that surprise people:

* ``batch_first=True`` changes the layout of ``input`` and ``output`` only. ``h0`` / ``c0`` /
  ``h_n`` / ``c_n`` stay ``[num_layers·D, B, H]`` — batch in the *middle* — in both layouts.
* The state of layer ``l``, direction ``d`` lives at index ``l·D + d`` of ``h0`` / ``h_n``.
* Dropout acts on the outputs of every layer except the last.

The step equations are those of :mod:`layerlab.layers.cells`. For speed, the input projection
``x W_ih^T + b`` is computed for all time steps in one matmul before the time loop, so each step
only does ``h W_hh^T`` plus element-wise work. This module holds the three step loops; the
parameters, checks and layer/direction plumbing they share live in
:mod:`layerlab.layers._recurrent_base`.

Dimension letters used in this module:

    T   sequence length
    B   batch size (absent for unbatched input)
    I   input features (``input_size``)
    H   hidden features (``hidden_size``)
    P   LSTM projection size (``proj_size``); H_out = P if P > 0 else H
    L   number of stacked layers (``num_layers``)
    D   directions: 2 if ``bidirectional`` else 1
    G   gates stacked in one weight: 1 (RNN), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n)

Limitations: ``PackedSequence`` inputs are not supported (pad them first). ``torch.jit.trace``
works but unrolls the time loop, so a trace is valid only for the sequence length it was traced
with; ``torch.compile`` likewise unrolls and compiles once per distinct length.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layerlab.layers._recurrent_base import RNNBase
from layerlab.layers._seq_checks import input_error, one_of

__all__ = ["RNN", "LSTM", "GRU"]


class RNN(RNNBase):
    r"""A multi-layer Elman RNN with tanh or ReLU non-linearity.

    For each layer and each element of the sequence:

    .. math::

        h_t = \tanh(x_t W_{ih}^T + b_{ih} + h_{t-1} W_{hh}^T + b_{hh})

    where :math:`x_t` is the input of layer 1, or the (dropped-out) output of the layer below.

    Args:
        input_size (int): number of features of the input (I).
        hidden_size (int): number of features of the hidden state (H).
        num_layers (int, optional): number of stacked layers (L). Default: 1
        nonlinearity (str, optional): ``'tanh'`` or ``'relu'``. Default: ``'tanh'``
        bias (bool, optional): if ``False``, no ``b_ih`` / ``b_hh``. Default: ``True``
        batch_first (bool, optional): input and output are ``(B, T, ·)`` instead of
            ``(T, B, ·)``; ``h0`` / ``h_n`` are *not* affected. Default: ``False``
        dropout (float, optional): dropout probability on the outputs of every layer except
            the last (training mode only). Default: 0
        bidirectional (bool, optional): run a second RNN on the reversed sequence and
            concatenate both outputs (D = 2). Default: ``False``

    Shape:
        - input: :math:`(T, B, I)`, :math:`(B, T, I)` with ``batch_first``, or :math:`(T, I)` (unbatched).
        - hx: :math:`(L \cdot D, B, H)` or :math:`(L \cdot D, H)` (unbatched); zeros when not given.
        - output: :math:`(T, B, D \cdot H)` (or :math:`(B, T, D \cdot H)`, or :math:`(T, D \cdot H)`):
          the last layer's :math:`h_t` for every t; for D = 2 forward then reverse features.
        - h_n: :math:`(L \cdot D, B, H)` or :math:`(L \cdot D, H)`: every layer's final state
          (for the reverse direction that is its state after reading :math:`x_0`).

        where:
            T = sequence length, B = batch size, I = input_size, H = hidden_size,
            L = num_layers, D = 2 if bidirectional else 1

    Attributes:
        weight_ih_l[k]: :math:`(H, I)` for k = 0, :math:`(H, D \cdot H)` otherwise
        weight_hh_l[k]: :math:`(H, H)`
        bias_ih_l[k], bias_hh_l[k]: :math:`(H)`
        ``*_reverse``: the same for the reverse direction.
        All ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`.

    Reference loop (one layer, one direction, time-major; ``forward`` adds layers, directions,
    dropout and layouts around it)::

        def rnn_layer(x, h, W_ih, W_hh, b_ih, b_hh):  # x: (T, B, I), h: (B, H)
            outputs = []
            for t in range(x.size(0)):
                h = torch.tanh(x[t] @ W_ih.T + b_ih + h @ W_hh.T + b_hh)
                outputs.append(h)
            return torch.stack(outputs), h
    """

    num_gates = 1
    _torch_cls = nn.RNN

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None) -> None:
        one_of("RNN", "nonlinearity", nonlinearity, ("tanh", "relu"))
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        return super()._config_keys() + ("nonlinearity",)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        return self._forward_h(input, hx)

    def _scan(self, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
        # b_hh sits outside the non-linearity next to b_ih, so fold both into the input projection.
        bias = None if b_ih is None else b_ih + b_hh
        xp = F.linear(x, w_ih, bias)  # (T, B, H): all steps' input projections in one matmul
        act = torch.tanh if self.nonlinearity == "tanh" else torch.relu
        w_hh_t = w_hh.t()  # (H, H)
        xs = xp.unbind(0)
        outputs: List[Tensor] = [h] * len(xs)
        for t in self._time_order(len(xs), reverse):
            h = act(torch.addmm(xs[t], h, w_hh_t))  # (B, H)
            outputs[t] = h
        return torch.stack(outputs), h, c


class LSTM(RNNBase):
    r"""A multi-layer long short-term memory (LSTM) network.

    For each layer and each element of the sequence, with gates stacked in torch's order
    **i, f, g, o**:

    .. math::

        \begin{array}{ll}
        i_t = \sigma(W_{ii} x_t + b_{ii} + W_{hi} h_{t-1} + b_{hi}) \\
        f_t = \sigma(W_{if} x_t + b_{if} + W_{hf} h_{t-1} + b_{hf}) \\
        g_t = \tanh(W_{ig} x_t + b_{ig} + W_{hg} h_{t-1} + b_{hg}) \\
        o_t = \sigma(W_{io} x_t + b_{io} + W_{ho} h_{t-1} + b_{ho}) \\
        c_t = f_t \odot c_{t-1} + i_t \odot g_t \\
        h_t = o_t \odot \tanh(c_t) \quad (\text{then } h_t = W_{hr} h_t \text{ if proj\_size} > 0)
        \end{array}

    Args:
        input_size (int): number of features of the input (I).
        hidden_size (int): number of features of the cell state (H).
        num_layers (int, optional): number of stacked layers (L). Default: 1
        bias (bool, optional): if ``False``, no ``b_ih`` / ``b_hh``. Default: ``True``
        batch_first (bool, optional): input and output are ``(B, T, ·)`` instead of
            ``(T, B, ·)``; ``h0``, ``c0``, ``h_n``, ``c_n`` are *not* affected. Default: ``False``
        dropout (float, optional): dropout probability on the outputs of every layer except
            the last (training mode only). Default: 0
        bidirectional (bool, optional): run a second LSTM on the reversed sequence and
            concatenate both outputs (D = 2). Default: ``False``
        proj_size (int, optional): if > 0, project ``h_t`` to P features with ``weight_hr``
            (an LSTM with projections). Default: 0

    Shape:
        - input: :math:`(T, B, I)`, :math:`(B, T, I)` with ``batch_first``, or :math:`(T, I)` (unbatched).
        - hx: a tuple ``(h0, c0)``: :math:`h_0` is :math:`(L \cdot D, B, H_{out})`, :math:`c_0` is
          :math:`(L \cdot D, B, H)` (drop B when unbatched); zeros when not given.
        - output: :math:`(T, B, D \cdot H_{out})` (or :math:`(B, T, D \cdot H_{out})`, or
          :math:`(T, D \cdot H_{out})`): the last layer's :math:`h_t` for every t.
        - (h_n, c_n): shaped like (h0, c0): every layer's final states.

        where:
            T = sequence length, B = batch size, I = input_size, H = hidden_size,
            L = num_layers, D = 2 if bidirectional else 1,
            H_out = proj_size if proj_size > 0 else hidden_size

    Attributes:
        weight_ih_l[k]: :math:`(4H, I)` for k = 0, :math:`(4H, D \cdot H_{out})` otherwise;
            row blocks ``[W_ii | W_if | W_ig | W_io]``
        weight_hh_l[k]: :math:`(4H, H_{out})`
        bias_ih_l[k], bias_hh_l[k]: :math:`(4H)`
        weight_hr_l[k]: :math:`(P, H)`, only with ``proj_size > 0``
        ``*_reverse``: the same for the reverse direction.
        All ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`.

    Reference loop (one layer, one direction, time-major, no projection)::

        def lstm_layer(x, h, c, W_ih, W_hh, b_ih, b_hh):  # x: (T, B, I), h and c: (B, H)
            outputs = []
            for t in range(x.size(0)):
                i, f, g, o = (x[t] @ W_ih.T + b_ih + h @ W_hh.T + b_hh).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            return torch.stack(outputs), (h, c)

    Example::

        >>> lstm = LSTM(10, 20, num_layers=2, batch_first=True)
        >>> out, (h_n, c_n) = lstm(torch.randn(4, 7, 10))
        >>> out.shape, h_n.shape   # h_n keeps the batch in dim 1 despite batch_first
        (torch.Size([4, 7, 20]), torch.Size([2, 4, 20]))
    """

    num_gates = 4
    _has_cell = True
    _torch_cls = nn.LSTM

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)

    @classmethod
    def _config_keys(cls) -> Tuple[str, ...]:
        return super()._config_keys() + ("proj_size",)

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        batched = self._check_input(input)
        h0 = c0 = None
        if hx is not None:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise input_error("LSTM", "hx", "a tuple (h0, c0)", type(hx).__name__,
                                  "pass hx=(h0, c0) with two tensors")
            batch = self._batch_size(input, batched)
            P_name = "proj_size" if self.proj_size else "H"
            h0 = self._check_state(hx[0], "h0", self.output_hidden_size, P_name, input, batch, batched)
            c0 = self._check_state(hx[1], "c0", self.hidden_size, "H", input, batch, batched)
        output, h_n, c_n = self._run(input, h0, c0, batched)
        return output, (h_n, c_n)

    def _scan(self, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
        # Both biases are added before the gate non-linearities, so fold them into one vector and
        # the input projection; their gradients stay equal to torch's (both = Σ gate grads).
        bias = None if b_ih is None else b_ih + b_hh
        xp = F.linear(x, w_ih, bias)  # (T, B, 4H): all steps' input projections in one matmul
        w_hh_t = w_hh.t()  # (H_out, 4H)
        xs = xp.unbind(0)
        outputs: List[Tensor] = [h] * len(xs)
        for t in self._time_order(len(xs), reverse):
            gates = torch.addmm(xs[t], h, w_hh_t)  # (B, 4H): all four gates in one matmul
            i, f, g, o = gates.chunk(4, dim=1)  # (B, H) each
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (B, H)
            h = torch.sigmoid(o) * torch.tanh(c)  # (B, H)
            if w_hr is not None:
                h = h @ w_hr.t()  # (B, P)
            outputs[t] = h
        return torch.stack(outputs), h, c


class GRU(RNNBase):
    r"""A multi-layer gated recurrent unit (GRU) network.

    For each layer and each element of the sequence, with gates stacked in torch's order
    **r, z, n**:

    .. math::

        \begin{array}{ll}
        r_t = \sigma(W_{ir} x_t + b_{ir} + W_{hr} h_{t-1} + b_{hr}) \\
        z_t = \sigma(W_{iz} x_t + b_{iz} + W_{hz} h_{t-1} + b_{hz}) \\
        n_t = \tanh(W_{in} x_t + b_{in} + r_t \odot (W_{hn} h_{t-1} + b_{hn})) \\
        h_t = (1 - z_t) \odot n_t + z_t \odot h_{t-1}
        \end{array}

    The reset gate multiplies ``W_hn h + b_hn`` *including* ``b_hn`` (torch's and cuDNN's
    placement), so ``b_hn`` cannot be folded into ``b_in``.

    Args:
        input_size (int): number of features of the input (I).
        hidden_size (int): number of features of the hidden state (H).
        num_layers (int, optional): number of stacked layers (L). Default: 1
        bias (bool, optional): if ``False``, no ``b_ih`` / ``b_hh``. Default: ``True``
        batch_first (bool, optional): input and output are ``(B, T, ·)`` instead of
            ``(T, B, ·)``; ``h0`` / ``h_n`` are *not* affected. Default: ``False``
        dropout (float, optional): dropout probability on the outputs of every layer except
            the last (training mode only). Default: 0
        bidirectional (bool, optional): run a second GRU on the reversed sequence and
            concatenate both outputs (D = 2). Default: ``False``

    Shape:
        - input: :math:`(T, B, I)`, :math:`(B, T, I)` with ``batch_first``, or :math:`(T, I)` (unbatched).
        - hx: :math:`(L \cdot D, B, H)` or :math:`(L \cdot D, H)` (unbatched); zeros when not given.
        - output: :math:`(T, B, D \cdot H)` (or :math:`(B, T, D \cdot H)`, or :math:`(T, D \cdot H)`).
        - h_n: :math:`(L \cdot D, B, H)` or :math:`(L \cdot D, H)`.

        where:
            T = sequence length, B = batch size, I = input_size, H = hidden_size,
            L = num_layers, D = 2 if bidirectional else 1

    Attributes:
        weight_ih_l[k]: :math:`(3H, I)` for k = 0, :math:`(3H, D \cdot H)` otherwise;
            row blocks ``[W_ir | W_iz | W_in]``
        weight_hh_l[k]: :math:`(3H, H)`, row blocks ``[W_hr | W_hz | W_hn]``
        bias_ih_l[k], bias_hh_l[k]: :math:`(3H)`
        ``*_reverse``: the same for the reverse direction.
        All ~ :math:`\mathcal{U}(-1/\sqrt{H}, 1/\sqrt{H})`.

    Reference loop (one layer, one direction, time-major)::

        def gru_layer(x, h, W_ih, W_hh, b_ih, b_hh):  # x: (T, B, I), h: (B, H)
            outputs = []
            for t in range(x.size(0)):
                xr, xz, xn = (x[t] @ W_ih.T + b_ih).chunk(3, dim=1)
                hr, hz, hn = (h @ W_hh.T + b_hh).chunk(3, dim=1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                n = torch.tanh(xn + r * hn)
                h = (1 - z) * n + z * h
                outputs.append(h)
            return torch.stack(outputs), h
    """

    num_gates = 3
    _torch_cls = nn.GRU

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        return self._forward_h(input, hx)

    def _scan(self, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
        H = self.hidden_size
        xp = F.linear(x, w_ih, b_ih)  # (T, B, 3H): all steps' input projections in one matmul
        w_hh_t = w_hh.t()  # (H, 3H)
        xs = xp.unbind(0)
        outputs: List[Tensor] = [h] * len(xs)
        for t in self._time_order(len(xs), reverse):
            xrz, xn = xs[t].split([2 * H, H], dim=1)  # (B, 2H), (B, H)
            # b_hh stays in the per-step matmul: b_hn must sit inside r ⊙ (W_hn h + b_hn).
            hh = F.linear(h, w_hh, b_hh) if b_hh is not None else h @ w_hh_t  # (B, 3H)
            hrz, hn = hh.split([2 * H, H], dim=1)
            r, z = torch.sigmoid(xrz + hrz).chunk(2, dim=1)  # (B, H) each
            n = torch.tanh(xn + r * hn)  # (B, H)
            h = torch.lerp(n, h, z)  # (1 − z) ⊙ n + z ⊙ h in one op
            outputs[t] = h
        return torch.stack(outputs), h, c
