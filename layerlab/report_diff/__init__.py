"""``layerlab diff``: what changed between two reports (see :mod:`layerlab.report_diff.run`).

Named ``report_diff`` rather than ``diff`` because ``layerlab.diff`` is the public function: a
subpackage of that name would replace it as an attribute of the package once imported.
"""

from layerlab.report_diff.load import ReportError
from layerlab.report_diff.report import Change, DiffReport
from layerlab.report_diff.run import diff

__all__ = ["diff", "DiffReport", "Change", "ReportError"]
