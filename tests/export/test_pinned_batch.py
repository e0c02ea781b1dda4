"""export(dyn B) and the ONNX cell name the line that pins the batch size (torch.export's message
says only "your code specialized it to be a constant (4)")."""

import inspect

import torch
from torch import nn

from layerlab.checks.report import Status
from layerlab.deploy.run import export_check


class HardCodedView(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        y = torch.relu(x)
        flat = y.view(4, -1)  # the batch size written as a number
        return self.fc(flat)


class LoopOverSamples(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        rows = [self.fc(x[i].flatten()) for i in range(x.shape[0])]  # a Python loop over the batch
        return torch.stack(rows)


class BatchFree(nn.Module):
    """Guards on other sizes (a length equal to the batch size) must not be blamed."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.reshape(x.shape[0], 3, 4)).sum(1)


def _line_of(cls, marker):
    lines, start = inspect.getsourcelines(cls)
    return f"{start + next(i for i, text in enumerate(lines) if marker in text)}"


def _cell(model, x):
    return export_check(model, x, paths=["export_dynamic"]).paths[0]


def test_the_hard_coded_view_line_is_named():
    torch.manual_seed(0)
    with torch.no_grad():  # the truth: torch.export refuses the dynamic batch, its message names no line
        try:
            torch.export.export(HardCodedView(), (torch.randn(4, 3, 4),),
                                dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
            raise AssertionError("torch.export accepted a pinned batch")
        except Exception as exc:
            assert "specialized it to be a constant (4)" in str(exc) and "test_pinned_batch.py" not in str(exc)
    cell = _cell(HardCodedView(), torch.randn(4, 3, 4))
    assert cell.status == Status.WARN and "batch size baked in" in cell.reason
    assert cell.where.endswith(f"test_pinned_batch.py:{_line_of(HardCodedView, 'y.view(4, -1)')}"), cell.where


def test_the_loop_over_samples_is_named():
    cell = _cell(LoopOverSamples(), torch.randn(4, 3, 4))
    assert cell.status == Status.WARN
    assert cell.where.endswith(f"test_pinned_batch.py:{_line_of(LoopOverSamples, 'for i in range')}"), cell.where


def test_a_vectorised_model_passes_and_logging_is_left_as_it_was():
    import logging

    log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    before = (log.level, log.propagate, list(log.handlers), logging.root.manager.disable)
    cell = _cell(BatchFree(), torch.randn(4, 3, 4))
    assert cell.status == Status.PASS, cell.reason
    assert (log.level, log.propagate, list(log.handlers), logging.root.manager.disable) == before
