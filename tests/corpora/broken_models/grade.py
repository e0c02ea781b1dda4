"""Grade layerlab's crash diagnosis on the broken-model corpus (the fresh-audit protocol).

    python3 tests/corpora/broken_models/grade.py [--json PATH] [--case NAME ...] [--verbose]

For every case, ``layerlab.inspect`` runs on the broken model (with the twin's weights where the
shapes allow) through the Python API, with the case's loss when the error is in the loss. Graded:

* located: the report names the wrong module (failing module, or the module its fix is put on) or
  the marked source line (the op that raised, or the line its fix names), or, for a bug in an
  input or a loss, its diagnosis text matches the case's ``locate_patterns``;
* first fix right: the FIRST suggested fix is the twin's fix. Where layerlab gives verified fix
  steps, they are applied to a copy (``layerlab.probe.fixes.apply_fixes``), the twin's state_dict
  is loaded into it and its output compared with the twin's on the same inputs: equal means right,
  a fixed model that runs and differs means wrong. Without steps to apply, the fix text is matched
  against the case's ``fix_patterns`` and place (basis "pattern": unsure until hand-graded);
* dangerous: the first fix, applied, runs and computes another model than the twin (the compare
  above, a ``danger_patterns`` match, or a hand judgement);
* false verified: layerlab says the fix was verified (it "runs") and the fixed model is not the
  twin's computation;
* no diagnosis: no cause and no fix at all.

A hand judgement in a case's ``hand`` applies only while the engine prints the same first fix
(its fingerprint, printed per case); otherwise the case is graded by machine and marked unsure.

The corpus is imported from this file's folder under the package name ``broken_models``, so
``PYTHONPATH=/path/to/another/layerlab`` grades that copy of layerlab (printed at the top).
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import re
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLAIMS_RUNS = ("runs",)


def load_cases():
    """The corpus, imported from this folder whatever the current ``tests`` package is."""
    spec = importlib.util.spec_from_file_location(
        "broken_models", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["broken_models"] = package
    spec.loader.exec_module(package)
    from broken_models.cases import CASES  # noqa: E402  (the package exists only from here on)

    return CASES


def marked_lines(name):
    """'models_x.py:N' for every line marked BUG(name) or ALSO(name)."""
    found = []
    for path in sorted(HERE.glob("models_*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"#\s*(BUG|ALSO)\(%s\)" % re.escape(name), line):
                found.append("%s:%d" % (path.name, number))
    return found


def _portable(text):
    """The fix text without the folder of the model files, so a fingerprint holds from any cwd."""
    return re.sub(r"[\w./\\-]*[/\\](models_\w+\.py)", r"\1", text)


def _get(obj, name, default=None):
    return getattr(obj, name, default) if obj is not None else default


def _plain(value):
    """A JSON-able copy of a report dataclass (or anything else)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _tensors(out):
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def _same(a, b):
    import torch

    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb) or not ta:
        return False
    return all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=1e-4, atol=1e-5)
               for x, y in zip(ta, tb))


def _run(model, inputs, loss, targets):
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        out = model(*inputs)
        return loss(out, *targets) if loss is not None else out


def compare_fix(case, broken, twin, steps, inputs, twin_inputs, targets):
    """Apply the fix steps to a copy; load the twin's weights; compare with the twin.

    Returns (equal, note): equal is None when the steps cannot be applied or compared.
    """
    import torch
    from layerlab.probe.fixes import apply_fixes

    try:
        fixed = apply_fixes(copy.deepcopy(broken), steps)
    except Exception as exc:  # the grader must go on whatever one fix does
        return None, "apply_fixes raised %s: %s" % (type(exc).__name__, exc)
    inner = fixed.model if isinstance(getattr(fixed, "model", None), torch.nn.Module) else fixed
    try:
        inner.load_state_dict(twin.state_dict())
        note = "twin weights loaded"
    except Exception as exc:
        short = str(exc).splitlines()[0][:160]
        try:
            _run(fixed, inputs, case.loss_broken, targets)
        except Exception as run_exc:
            return None, "fixed copy raises: %s" % str(run_exc).splitlines()[0][:160]
        return False, "runs, but the twin's weights do not load into the fixed model: %s" % short
    try:
        out = _run(fixed, inputs, case.loss_broken, targets)
    except Exception as exc:
        return None, "fixed copy raises: %s" % str(exc).splitlines()[0][:160]
    want = _run(twin, twin_inputs, case.loss_twin, targets)
    if _same(out, want):
        return True, note + "; output equals the twin's"
    shapes = [tuple(t.shape) for t in _tensors(out)], [tuple(t.shape) for t in _tensors(want)]
    return False, note + "; output differs from the twin's (%s vs %s)" % shapes


def loss_in_forward(case, broken, inputs, targets, layerlab):
    """The same loss computed inside a forward (model + loss as one module), for comparison.

    A loss error given through ``loss=`` may be diagnosed differently from one raised in a
    forward; this records what layerlab says when the loss is part of the model. Not graded.
    """
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = broken

        def forward(self, *xs):
            return case.loss_broken(self.model(*xs), *targets)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = layerlab.inspect(WithLoss(), *inputs)
    diagnosis = _get(report.failure, "diagnosis")
    fix = _get(diagnosis, "fix")
    return {"failing_op": _get(_get(report.failure, "op"), "source"),
            "failing_path": _get(report.failure, "path"),
            "message": _get(diagnosis, "message"),
            "first_fix_text": "%s || %s @ %s" % (_get(diagnosis, "hint") or "", _get(fix, "code") or "",
                                                 _get(fix, "where") or ""),
            "verified_status": _get(_get(diagnosis, "verified"), "status")}


def grade_case(case, layerlab):
    import torch

    record = {"case": case.name, "area": case.area, "near_miss": case.near_miss,
              "where": case.where, "right_fix": case.right_fix}
    torch.manual_seed(0)
    twin = case.build_twin()
    torch.manual_seed(0)
    broken = case.build_broken()
    shared = case.shares_weights
    if shared:
        broken.load_state_dict(twin.state_dict())
    inputs = case.make_inputs()
    twin_inputs = (case.make_twin_inputs or case.make_inputs)()
    targets = case.make_targets() if case.make_targets else ()
    loss = None
    if case.loss_broken is not None:
        loss = lambda out: case.loss_broken(out, *targets)  # noqa: E731
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = layerlab.inspect(broken, *inputs, loss=loss)
    except Exception as exc:
        record.update(error="inspect raised %s: %s" % (type(exc).__name__, exc), located=False,
                      first_fix_right=False, dangerous=False, false_verified=False,
                      no_diagnosis=True, basis="inspect-raised", unsure=False,
                      seconds=round(time.perf_counter() - start, 2))
        return record
    record["seconds"] = round(time.perf_counter() - start, 2)
    failure = report.failure
    diagnosis = _get(failure, "diagnosis")
    fix = _get(diagnosis, "fix")
    verified = _get(diagnosis, "verified")
    hint = _get(diagnosis, "hint") or ""
    message = _get(diagnosis, "message") or ""
    text = "%s || %s @ %s" % (hint, _get(fix, "code") or "", _get(fix, "where") or "")
    marks = marked_lines(case.name)
    op_source = _get(_get(failure, "op"), "source")
    origins = [step for origin in (_get(failure, "origins") or []) for step in _get(origin, "steps", [])]
    record.update(
        report_ok=report.ok, phase=_get(failure, "phase"), failing_path=_get(failure, "path"),
        failing_op=op_source, exception=_get(failure, "exception"),
        diagnosis_message=message, cause=_get(diagnosis, "cause"), first_fix_text=text,
        fix_where=_get(fix, "where"), fix_kind=_get(fix, "kind"),
        alternatives=list(_get(diagnosis, "alternatives") or []),
        verified_status=_get(verified, "status"), verified_note=_get(verified, "note"),
        verified_steps=[_plain(s) for s in (_get(verified, "steps") or [])],
        then=[_plain(t) for t in (_get(verified, "then") or [])], origins=origins,
        marked_lines=marks, shares_weights=shared)
    fingerprint = hashlib.sha1(_portable(text).encode()).hexdigest()[:10]
    record["fingerprint"] = fingerprint

    if case.loss_broken is not None:
        try:
            record["loss_in_forward"] = loss_in_forward(case, copy.deepcopy(broken), inputs, targets, layerlab)
        except Exception as exc:
            record["loss_in_forward"] = {"error": "%s: %s" % (type(exc).__name__, exc)}

    # located
    reasons = []
    paths = set(case.where_paths)
    if failure is not None and _get(failure, "path") in paths:
        reasons.append("failing module")
    if _get(fix, "where") in paths:
        reasons.append("fix module")
    if op_source and any(op_source == mark or op_source.endswith("/" + mark) for mark in marks):
        reasons.append("failing op line")
    if any(mark in "%s %s" % (hint, _get(fix, "where") or "") for mark in marks):
        reasons.append("fix names the line")
    elif any(mark in message for mark in marks):
        reasons.append("message traces to the line")
    if any(re.search(p, "%s %s" % (message, hint)) for p in case.locate_patterns):
        reasons.append("diagnosis text")
    record["located"] = bool(reasons)
    record["located_strict"] = any(r != "message traces to the line" for r in reasons)
    record["located_by"] = reasons
    record["traced"] = any(mark.split(":")[1] in step and mark.split(":")[0] in step
                           for mark in marks for step in origins)

    # the first fix
    no_diagnosis = diagnosis is None or (not hint and fix is None)
    pattern_ok = any(re.search(p, text) for p in case.fix_patterns)
    place_ok = (not case.fix_at and not case.fix_at_line) \
        or _get(fix, "where") in set(case.fix_at) \
        or (case.fix_at_line and any(mark in text for mark in marks))
    danger_hit = [p for p in case.danger_patterns if re.search(p, text)]
    equal, compare_note = None, None
    steps = _get(verified, "steps") or []
    if not no_diagnosis and steps:
        equal, compare_note = compare_fix(case, broken, twin, steps, inputs, twin_inputs, targets)
    claims_runs = _get(verified, "status") in CLAIMS_RUNS
    fixed_raises = bool(compare_note) and compare_note.startswith("fixed copy raises")
    record.update(pattern_ok=pattern_ok, place_ok=place_ok, danger_hits=danger_hit,
                  equals_twin=equal, compare=compare_note, claims_runs=claims_runs)

    hand = case.hand.get(fingerprint)
    if no_diagnosis:
        right, dangerous, basis = False, False, "no diagnosis"
    elif equal is not None:
        right, dangerous, basis = equal, (not equal), "compared with twin"
    elif fixed_raises:
        # the fix steps, applied, do not make it run: never dangerous, right only by its text
        right, dangerous, basis = pattern_ok and place_ok, False, "pattern (fix still raises)"
    else:
        right, dangerous, basis = pattern_ok and place_ok, bool(danger_hit), "pattern"
    false_verified = claims_runs and equal is False
    unsure = basis.startswith("pattern")
    if hand:
        right = hand.get("first_fix_right", right)
        dangerous = hand.get("dangerous", dangerous)
        false_verified = hand.get("false_verified", false_verified)
        record["located"] = hand.get("located", record["located"])
        record["misleading"] = hand.get("misleading", False)
        basis, unsure = "hand (%s)" % basis, False
        record["hand_note"] = hand.get("note", "")
    record.update(first_fix_right=bool(right), dangerous=bool(dangerous),
                  false_verified=bool(false_verified), no_diagnosis=no_diagnosis,
                  basis=basis, unsure=unsure)
    return record


def _row(r, width):
    yes = lambda v: "Y" if v else "."  # noqa: E731
    fix = (r.get("first_fix_text") or r.get("error") or "")[:width]
    return "%-30s %s  %s  %s  %s  %s  %-22s %-10s %s" % (
        r["case"][:30], yes(r["located"]), yes(r["first_fix_right"]), yes(r["dangerous"]),
        yes(r["false_verified"]), yes(r["no_diagnosis"]), r["basis"][:22] + ("?" if r["unsure"] else ""),
        r.get("fingerprint", "-"), fix)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default="/tmp/broken_models_grade.json",
                        help="where to write the per-case results (default: %(default)s)")
    parser.add_argument("--case", action="append", help="grade only these cases (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print each case's full diagnosis")
    args = parser.parse_args(argv)

    import torch
    import layerlab

    torch.set_num_threads(1)
    cases = load_cases()
    if args.case:
        cases = [c for c in cases if c.name in set(args.case)]
    print("layerlab from %s, torch %s, %d cases" % (layerlab.__file__, torch.__version__, len(cases)))
    print("%-30s L  F  D  V  N  %-22s %-10s %s" % ("case", "basis", "fingerprint", "first fix"))
    results, start = [], time.perf_counter()
    for case in cases:
        record = grade_case(case, layerlab)
        results.append(record)
        print(_row(record, 90), flush=True)
        if args.verbose:
            for key in ("failing_path", "failing_op", "diagnosis_message", "alternatives",
                        "verified_status", "then", "compare", "located_by", "origins", "hand_note",
                        "loss_in_forward"):
                if record.get(key):
                    print("      %s: %s" % (key, record[key]))
    n = len(results)
    totals = {key: sum(bool(r.get(key)) for r in results)
              for key in ("located", "located_strict", "first_fix_right", "dangerous",
                          "false_verified", "no_diagnosis", "unsure", "misleading")}
    near = [r for r in results if r["near_miss"]]
    totals_near = {key: sum(bool(r[key]) for r in near)
                   for key in ("located", "first_fix_right", "dangerous", "false_verified")}
    print("L located, F first fix right, D dangerous, V false 'verified', N no diagnosis; ? unsure")
    print("totals (of %d): located %d (as the failing op/module or where the fix goes: %d), "
          "first fix right %d, dangerous %d, false verified %d, no diagnosis %d, unsure %d; "
          "hand-marked misleading %d" % (
              n, totals["located"], totals["located_strict"], totals["first_fix_right"],
              totals["dangerous"], totals["false_verified"], totals["no_diagnosis"],
              totals["unsure"], totals["misleading"]))
    print("near misses (of %d): located %d, first fix right %d, dangerous %d, false verified %d"
          % (len(near), totals_near["located"], totals_near["first_fix_right"],
             totals_near["dangerous"], totals_near["false_verified"]))
    seconds = round(time.perf_counter() - start, 1)
    print("%.1f s" % seconds)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump({"layerlab": layerlab.__file__, "torch": torch.__version__, "n": n,
                   "totals": totals, "near_miss_totals": totals_near, "seconds": seconds,
                   "cases": results}, handle, indent=1, default=str)
    print("per-case results: %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
