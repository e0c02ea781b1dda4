"""Grade layerlab on the silent-shape-bug corpus: does it name the wrong op and its source line?

    python3 tests/corpora/silent_bugs/grade.py [--json PATH] [--case NAME] [--no-others]

For every case, ``layerlab.inspect`` runs on the buggy model and on its correct twin (the same
weights), once as a user calls it and once with ``ops=True``. A finding is any report item of
severity warning or error (``problems``, a ``failure``, and any list of severity-carrying items a
later report adds). Grading:

* flagged: a finding on the buggy model names the op (its name or an alias, or quotes the buggy
  line) and the source line (``file.py:LINE``, ``line LINE``, or the line's text);
* partial: a finding names the op or the line, but not both; a finding that names neither is
  listed (hand-check it);
* false finding: a finding on a twin. Gradient-health codes (vanishing, no-grad, ...) are counted
  apart from shape/axis findings, because a correct model can earn them.

``--no-others`` skips the ungraded part: ``layerlab.verify`` (gradcheck and the batch checks,
without a reference) and ``layerlab.train_check`` on the buggy model and on the twin, reported as
what each found on one and not the other.

The corpus is imported from this file's folder under the package name ``silent_bugs``, so
``PYTHONPATH=/path/to/another/layerlab`` grades that copy of layerlab (printed at the top).
"""

import argparse
import dataclasses
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRADIENT_HEALTH = ("vanishing", "exploding", "no-grad", "zero-grad", "nonfinite", "nan", "inf",
                   "expected-grad")
REPORT_FIELDS_NOT_FINDINGS = {"calls", "params", "ops", "inputs", "outputs", "checks", "probes"}


def load_cases():
    """The corpus, imported from this folder whatever the current ``tests`` package is."""
    spec = importlib.util.spec_from_file_location(
        "silent_bugs", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["silent_bugs"] = package
    spec.loader.exec_module(package)
    from silent_bugs.cases import CASES  # noqa: E402  (the package exists only from here on)

    return CASES


def as_text(item) -> str:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        try:
            return json.dumps(dataclasses.asdict(item), default=str, ensure_ascii=False)
        except Exception:  # a field asdict cannot copy: fall back to the repr
            pass
    return str(item)


def findings_of(report) -> list:
    """Every warning/error item of an inspect report, as ``{code, severity, where, text}``."""
    found = []
    if getattr(report, "failure", None) is not None:
        found.append({"code": "failure", "severity": "error", "where": None, "text": as_text(report.failure)})
    fields = [f.name for f in dataclasses.fields(report)] if dataclasses.is_dataclass(report) else []
    for name in fields:
        value = getattr(report, name)
        if name in REPORT_FIELDS_NOT_FINDINGS or not isinstance(value, (list, tuple)):
            continue
        for item in value:
            get = item.get if isinstance(item, dict) else lambda key, default=None: getattr(item, key, default)
            severity = str(get("severity", "")).lower().split(".")[-1]
            if severity in ("warning", "error", "problem"):
                found.append({"code": str(get("code", name)), "severity": severity,
                              "where": get("where", None), "text": as_text(item)})
    return found


def rendered_counts(layerlab, report):
    """(errors, warnings) as the rendered report's result line counts them, or None."""
    text = layerlab.render(report, width=200)
    match = re.search(r"\((\d+) errors?\b.*?(\d+) warnings?\)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _normalised(text: str) -> str:
    return re.sub(r"\s+", "", text)


def names_op(case, text: str) -> bool:
    if _normalised(case.line) in _normalised(text):
        return True
    for name in (case.op, *case.aliases):
        if len(name) < 2:
            continue                       # "-", "*", "@": too common to count as naming the op
        if name.isidentifier():
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text):
                return True
        elif name in text:
            return True
    return False


def names_line(case, text: str, file: str, lineno: int) -> bool:
    return (re.search(rf"{re.escape(file)}:{lineno}(?!\d)", text) is not None
            or re.search(rf"\bline {lineno}\b", text) is not None
            or _normalised(case.line) in _normalised(text))


def grade_findings(case, findings, location) -> dict:
    file, lineno = location
    verdict = "missed"
    for finding in findings:
        op, line = names_op(case, finding["text"]), names_line(case, finding["text"], file, lineno)
        finding["names_op"], finding["names_line"] = op, line
        if op and line:
            verdict = "flagged"
        elif (op or line) and verdict == "missed":
            verdict = "partial"
    if verdict == "missed" and findings:
        verdict = "unrelated"
    return {"verdict": verdict, "findings": findings}


def is_shape_finding(finding) -> bool:
    return not finding["code"].startswith(GRADIENT_HEALTH)


def run_inspect(layerlab, case, build, ops: bool) -> dict:
    started = time.perf_counter()
    try:
        report = layerlab.inspect(build(), *case.make_inputs(), ops=ops)
    except Exception as exc:  # a raise here is layerlab's (inspect reports the model's own raises)
        return {"raised": f"{type(exc).__name__}: {exc}", "findings": [], "seconds": 0.0}
    findings = findings_of(report)
    counts = rendered_counts(layerlab, report)
    # a report that counts more warnings/errors than this grader extracted has findings somewhere
    # findings_of does not look: say so, so that a grade is never silently low
    unextracted = counts is not None and sum(counts) > len(findings)
    return {"ok": bool(report.ok), "findings": findings, "rendered_counts": counts,
            "unextracted_findings": unextracted, "seconds": round(time.perf_counter() - started, 3)}


def run_verify(layerlab, case, build) -> dict:
    try:
        report = layerlab.verify(build(), *case.make_inputs())
    except Exception as exc:
        return {"raised": f"{type(exc).__name__}: {exc}"}
    status = {check.name: str(getattr(check.status, "value", check.status)) for check in report.checks}
    return {"failed": sorted(n for n, s in status.items() if s == "fail"),
            "warned": sorted(n for n, s in status.items() if s == "warning"),
            "passed": sorted(n for n, s in status.items() if s == "pass"),
            "skipped": {check.name: check.summary for check in report.checks if status[check.name] == "skip"},
            "summaries": {check.name: check.summary for check in report.checks
                          if status[check.name] in ("fail", "warning")}}


def run_train_check(layerlab, case, build) -> dict:
    try:
        report = layerlab.train_check(build(), *case.make_inputs())
    except Exception as exc:
        return {"raised": f"{type(exc).__name__}: {exc}"}
    flags = [{"code": flag.code, "where": getattr(flag, "where", None),
              "severity": str(getattr(flag, "severity", "")), "text": as_text(flag)}
             for flag in report.flags]
    return {"ok": bool(report.ok), "verdict": getattr(report.fit, "verdict", None), "flags": flags}


def others(layerlab, case) -> dict:
    """verify and train_check on both models; 'caught' = found on the buggy model, not the twin."""
    out = {}
    for tool, run in (("verify", run_verify), ("train_check", run_train_check)):
        buggy, twin = run(layerlab, case, case.build_buggy), run(layerlab, case, case.build_twin)
        if tool == "verify":
            caught = sorted(set(buggy.get("failed", [])) - set(twin.get("failed", [])))
            twin_false = twin.get("failed", [])
            # not a verdict, but a difference: a check the twin passes that cannot run on the bug
            out["verify_skipped_on_buggy_only"] = sorted(set(buggy.get("skipped", {})) & set(twin.get("passed", [])))
        else:
            codes = lambda r: {f["code"] for f in r.get("flags", []) if "warn" not in f["severity"].lower()}
            caught = sorted(codes(buggy) - codes(twin))
            twin_false = sorted(codes(twin))
        out[tool] = {"buggy": buggy, "twin": twin, "caught": caught, "twin_failures": twin_false}
    return out


def grade_case(layerlab, case, with_others: bool) -> dict:
    location = case.buggy_location()
    row = {"name": case.name, "area": case.area, "op": case.op, "line": case.line,
           "location": f"{location[0]}:{location[1]}", "intent": case.intent}
    for label, ops in (("default", False), ("ops", True)):
        buggy = run_inspect(layerlab, case, case.build_buggy, ops)
        twin = run_inspect(layerlab, case, case.build_twin, ops)
        row[label] = {"buggy": {**buggy, **grade_findings(case, buggy["findings"], location)},
                      "twin": {**twin, "shape_findings": [f for f in twin["findings"] if is_shape_finding(f)]}}
    if with_others:
        row["others"] = others(layerlab, case)
    return row


def _short(findings) -> str:
    return ",".join(sorted({f["code"] for f in findings})) or "-"


def print_table(rows, with_others: bool) -> None:
    header = f"{'case':46} {'area':13} {'inspect':9} {'ops=True':9} {'buggy findings':22} {'twin findings':18}"
    if with_others:
        header += f" {'verify caught':38} {'verify skipped (twin passed)':38} {'train-check caught':18}"
    print(header)
    print("-" * len(header))
    for row in rows:
        buggy_findings = row["default"]["buggy"]["findings"] + row["ops"]["buggy"]["findings"]
        twin_findings = row["default"]["twin"]["findings"] + row["ops"]["twin"]["findings"]
        line = (f"{row['name']:46} {row['area']:13} {row['default']['buggy']['verdict']:9} "
                f"{row['ops']['buggy']['verdict']:9} {_short(buggy_findings):22} {_short(twin_findings):18}")
        if with_others:
            line += (f" {','.join(row['others']['verify']['caught']) or '-':38}"
                     f" {','.join(row['others']['verify_skipped_on_buggy_only']) or '-':38}"
                     f" {','.join(row['others']['train_check']['caught']) or '-':18}")
        print(line)


def totals(rows, with_others: bool) -> dict:
    n = len(rows)
    out = {"cases": n}
    for label in ("default", "ops"):
        verdicts = [row[label]["buggy"]["verdict"] for row in rows]
        out[label] = {v: verdicts.count(v) for v in ("flagged", "partial", "unrelated", "missed")}
        out[label]["twins_with_shape_findings"] = sum(bool(row[label]["twin"]["shape_findings"]) for row in rows)
        out[label]["twins_with_any_finding"] = sum(bool(row[label]["twin"]["findings"]) for row in rows)
        out[label]["reports_with_unextracted_findings"] = sum(
            bool(row[label][side].get("unextracted_findings")) for row in rows for side in ("buggy", "twin"))
    if with_others:
        for tool in ("verify", "train_check"):
            out[tool] = {"caught": sum(bool(row["others"][tool]["caught"]) for row in rows),
                         "twins_failed": sum(bool(row["others"][tool]["twin_failures"]) for row in rows)}
        out["verify"]["skipped_on_buggy_only"] = sum(bool(row["others"]["verify_skipped_on_buggy_only"])
                                                     for row in rows)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the per-case results and totals here")
    parser.add_argument("--case", action="append", help="grade only this case (repeatable)")
    parser.add_argument("--no-others", action="store_true", help="skip verify and train_check")
    args = parser.parse_args(argv)

    cases = load_cases()
    if args.case:
        unknown = set(args.case) - {case.name for case in cases}
        if unknown:
            parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
        cases = [case for case in cases if case.name in args.case]
    import torch
    import layerlab

    torch.set_num_threads(1)
    with_others = not args.no_others
    print(f"layerlab from {Path(layerlab.__file__).parent}, torch {torch.__version__}, {len(cases)} cases")
    started = time.perf_counter()
    rows = [grade_case(layerlab, case, with_others) for case in cases]
    summary = totals(rows, with_others)
    print_table(rows, with_others)
    d = summary["default"]
    print(f"\ninspect (default): flagged {d['flagged']}/{len(rows)} (right op and line), partial "
          f"{d['partial']}, unrelated findings only {d['unrelated']}, missed {d['missed']}; twins with "
          f"a shape/axis finding {d['twins_with_shape_findings']}/{len(rows)}, with any finding "
          f"{d['twins_with_any_finding']}/{len(rows)}")
    unextracted = d["reports_with_unextracted_findings"] + summary["ops"]["reports_with_unextracted_findings"]
    if unextracted:
        print(f"CHECK BY HAND: {unextracted} report(s) count more warnings/errors than this grader "
              f"extracted (see 'unextracted_findings' in the JSON)")
    o = summary["ops"]
    print(f"inspect (ops=True): flagged {o['flagged']}/{len(rows)}, partial {o['partial']}, twins with a "
          f"shape/axis finding {o['twins_with_shape_findings']}/{len(rows)}")
    if with_others:
        for tool in ("verify", "train_check"):
            t = summary[tool]
            print(f"{tool}: found something on the buggy model and not on its twin in {t['caught']}/{len(rows)}; "
                  f"failed a twin in {t['twins_failed']}/{len(rows)}")
        print(f"verify: a check the twin passes was skipped on the buggy model in "
              f"{summary['verify']['skipped_on_buggy_only']}/{len(rows)} (a difference, not a verdict)")
    print(f"({time.perf_counter() - started:.1f} s)")
    if args.json:
        document = {"layerlab": str(Path(layerlab.__file__).parent), "torch": torch.__version__,
                    "totals": summary, "cases": rows}
        Path(args.json).write_text(json.dumps(document, indent=1, default=str, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
