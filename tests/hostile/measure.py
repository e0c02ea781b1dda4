"""Run the FULL hostile matrix and print the figures for the README's reliability section.

    python -m tests.hostile.measure                 # fork mode (fast), 2 workers
    python -m tests.hostile.measure --exec          # a real `python -m layerlab` per run (slow)
    python -m tests.hostile.measure --only inspect  # one command

Prints: hostile inputs (entries), runs, clean refusals (exit 2 as expected), expected exit 1/0,
tracebacks, hangs, killed runs, the other contract breaks by cause, the slowest run, and the peak
resident memory of the worst run (``wait4``'s ``ru_maxrss``), under the memory cap.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from tests.hostile.corpus import all_entries
from tests.hostile.harness import CAP_BYTES, TIMEOUT_S, run_jobs
from tests.hostile.matrix import full_matrix, jobs_for
from tests.hostile.verdict import cause_line, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exec", action="store_true", help="fork+exec python -m layerlab for every run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cap-gb", type=float, default=CAP_BYTES / 2**30)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    parser.add_argument("--only", help="run only this command")
    args = parser.parse_args(argv)

    entries = all_entries()
    runs = [r for r in full_matrix(entries) if not args.only or r.command == args.only]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="layerlab-measure-") as root:
        jobs = jobs_for(runs, Path(root))
        outcomes = run_jobs(list(jobs.values()), mode="exec" if args.exec else "fork", workers=args.workers,
                            cap=int(args.cap_gb * 2**30), timeout=args.timeout, scratch=root)
        verdicts = [(run, o, problems(run.entry, run.command, run.json_mode, o, jobs[run.id].cwd))
                    for run, o in zip(runs, outcomes)]
    wall = time.monotonic() - started

    broken = [(r, o, p) for r, o, p in verdicts if p]
    rcs = collections.Counter(o.rc for _, o, _ in verdicts)
    worst = max(verdicts, key=lambda v: v[1].maxrss_kb)
    slowest = max(verdicts, key=lambda v: v[1].seconds)
    print(f"hostile inputs: {len(entries)} spec entries; {len(runs)} runs "
          f"({'exec' if args.exec else 'fork'} mode, cap {args.cap_gb:g} GB, timeout {args.timeout:g} s)")
    print(f"exit codes: " + ", ".join(f"{rc}: {n}" for rc, n in sorted(rcs.items(), key=str)))
    print(f"clean refusals (exit 2, one message, no traceback): "
          f"{sum(1 for _, o, p in verdicts if o.rc == 2 and not p)}")
    print(f"clean runs in all (contract kept): {len(verdicts) - len(broken)} / {len(verdicts)}")
    print(f"tracebacks: {sum(1 for _, _, p in verdicts if 'traceback' in p)}")
    print(f"hangs (killed at {args.timeout:g} s): {sum(1 for _, o, _ in verdicts if o.timed_out)}")
    print(f"killed by a signal (memory cap): {sum(1 for _, o, _ in verdicts if o.signal and not o.timed_out)}")
    print(f"peak memory of the worst run: {worst[1].maxrss_kb / 1024:.0f} MB ({worst[0].id})")
    print(f"slowest run: {slowest[1].seconds:.1f} s ({slowest[0].id})")
    print(f"wall time: {wall:.0f} s with {args.workers} workers")
    by_cause = collections.defaultdict(list)
    for run, outcome, found in broken:
        by_cause[run.entry.cause].append(cause_line(run.entry, run.command, run.json_mode, outcome, found))
    for cause in sorted(by_cause):
        print(f"\n== {cause}: {len(by_cause[cause])} broken runs")
        for line in by_cause[cause]:
            print("  " + line)
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
