"""Grade layerlab's crash diagnosis on the second broken-model corpus.

    python3 tests/corpora/broken_models_second/grade.py [--json PATH] [--case NAME ...] [--verbose]

The grading logic is ``../broken_models/grade.py``'s, imported and reused as is (located, first
fix right, dangerous, false verified, no diagnosis; fixes with steps applied to a copy and compared
with the twin). Only the corpus differs: the cases and the ``# BUG(name)`` marks are read from this
folder, imported under the package name ``broken_models_second``. Default JSON: after.json here.

One extension, for a bug in the loss: the first grader applies the fix steps to a copy of the
model and then calls the loss outside it, so a fix that edits a line of the loss is never applied
there and the fixed copy "still raises". Here, for a case with a loss, the steps are applied to a
copy of the model and its loss joined in one module (the loss computed inside its forward), whose
output is then compared with the twin's loss; where that cannot be applied, the first grader's
compare is used unchanged.
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _first_grader():
    spec = importlib.util.spec_from_file_location(
        "broken_models_first_grade", HERE.parent / "broken_models" / "grade.py")
    grader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grader)
    return grader


def load_cases():
    """This corpus, imported from this folder whatever the current ``tests`` package is."""
    spec = importlib.util.spec_from_file_location(
        "broken_models_second", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["broken_models_second"] = package
    spec.loader.exec_module(package)
    from broken_models_second.cases import CASES  # noqa: E402  (the package exists only from here on)

    return CASES


def _compare_with_loss(grader):
    """compare_fix that applies a fix in the loss to the model and the loss joined in one module."""
    first = grader.compare_fix

    def compare_fix(case, broken, twin, steps, inputs, twin_inputs, targets):
        if case.loss_broken is None:
            return first(case, broken, twin, steps, inputs, twin_inputs, targets)
        import copy

        import torch
        from layerlab.probe.fixes import apply_fixes

        class WithLoss(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, *xs):
                return case.loss_broken(self.model(*xs), *targets)

        try:
            fixed = apply_fixes(copy.deepcopy(WithLoss(broken)), steps)
            inner = fixed.model if isinstance(getattr(fixed, "model", None), torch.nn.Module) else fixed
            inner = inner.model if isinstance(getattr(inner, "model", None), torch.nn.Module) else inner
            inner.load_state_dict(twin.state_dict())
            out = grader._run(fixed, inputs, None, ())
        except Exception:  # the joined module cannot take these steps: the first grader's compare
            return first(case, broken, twin, steps, inputs, twin_inputs, targets)
        want = grader._run(twin, twin_inputs, case.loss_twin, targets)
        if grader._same(out, want):
            return True, "loss joined to the model; twin weights loaded; loss equals the twin's"
        return False, "loss joined to the model; twin weights loaded; loss differs from the twin's"

    return compare_fix


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--json" not in argv:
        argv += ["--json", str(HERE / "after.json")]
    grader = _first_grader()
    grader.HERE = HERE  # marked_lines() reads the models_*.py of this folder
    grader.load_cases = load_cases
    grader.compare_fix = _compare_with_loss(grader)
    return grader.main(argv)


if __name__ == "__main__":
    sys.exit(main())
