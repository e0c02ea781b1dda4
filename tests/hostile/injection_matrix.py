"""The injection matrix: one hostile payload through every command, on a pipe and on a terminal.

The payload (``tests/corpora/injection_payloads/payloads.json``) enters at every place untrusted
text comes from, each place with its own tag so a leak names its place:

* ``MOD`` a module name (``add_module`` with the payload as name) and ``WARN`` a warning, in the
  model that runs (its forward also prints a line: under ``--json`` it must land on stderr, and
  stdout stay one JSON document);
* ``EXC`` the message of the exception a second model's forward raises;
* ``SPEC`` the spec's ``name:``; ``FILE`` the spec file's name (no NUL, no '/');
* ``ARG`` a command-line value (``explain-shape --op``); ``JSONF`` the names in a JSON report given
  to ``diff`` (the JSON holds the raw characters, escaped the JSON way).

Every command (inspect, gradcheck, export-check, profile, train-check, precision-check, ddp-check
with one rank, diff, explain-shape, and ``layerlab.verify``/``inspect`` from Python, printed) runs
once per model, human and ``--json``, on a pipe and on a pty, in one server process
(:mod:`tests.hostile.injection_runner`). :func:`judge` then says, for each run and each place, what
leaked: a raw control sequence, interpreted markup, a forged line, a traceback, JSON that is not one
document. ``python -m tests.hostile.injection_matrix [PYTHONPATH]`` prints the cells (payload place ×
command) that leaked, so another checkout (the pristine one) can be measured with the same jobs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from tests.corpora.injection_payloads import parts, payload

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("injection_runner.py")

MODEL = '''\
import warnings

import torch
from torch import nn

MOD, WARN, EXC = {mod!r}, {warn!r}, {exc!r}


class Evil(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module(MOD, nn.Linear(4, 4))
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        print("debug from forward PRN", flush=True)
        warnings.warn(WARN)
        return self.head(torch.tanh(getattr(self, MOD)(x)))


class Raiser(Evil):
    def forward(self, x):
        print("debug from forward PRN", flush=True)
        raise RuntimeError(EXC)
'''

SPEC = '''\
name: {name}
layer: ./evil_model.py:{cls}
input: {{shape: [4, 4]}}
train: {{loss: mse, target: {{shape: [4, 4]}}, optimizer: sgd, lr: 0.1, steps: 3}}
ddp: {{nproc: 1, timeout: 60}}
'''

PYTHON = '''\
import sys, torch, layerlab
sys.path.insert(0, ".")
from evil_model import {cls}
x = torch.randn(4, 4)
for call in (lambda: layerlab.verify({cls}(), x), lambda: layerlab.inspect({cls}(), x)):
    try:
        print(call())
    except Exception as exc:
        print("raised", type(exc).__name__)
'''

#: command → argv after ``layerlab`` ({spec} is the spec file); None: a Python job
COMMANDS: Dict[str, Optional[List[str]]] = {
    "inspect": ["inspect", "{spec}", "--allow-import"],
    "gradcheck": ["gradcheck", "{spec}", "--allow-import"],
    "export-check": ["export-check", "{spec}", "--allow-import", "--paths", "trace"],
    "profile": ["profile", "{spec}", "--allow-import"],
    "train-check": ["train-check", "{spec}", "--allow-import"],
    "precision-check": ["precision-check", "{spec}", "--allow-import"],
    "ddp-check": ["ddp-check", "{spec}", "--allow-import", "--nproc", "1"],
    "verify (Python)": None,
}
MODELS = ("Evil", "Raiser")
TAGS = ("MOD", "WARN", "EXC", "SPEC", "FILE", "ARG", "JSONF")
QUICK = ("inspect",)

CSI_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # Rich's own colours on a terminal


def place_payloads() -> Dict[str, str]:
    return {tag: payload(tag) for tag in ("MOD", "WARN", "EXC", "SPEC", "ARG", "JSONF")}


def setup(work: Path) -> Dict[str, Path]:
    """The model, one spec per model (the payload in its name: and its file name), and the diff's
    JSON reports; return the spec paths by model."""
    p = place_payloads()
    (work / "evil_model.py").write_text(MODEL.format(mod=p["MOD"], warn=p["WARN"], exc=p["EXC"]),
                                        encoding="utf-8", errors="surrogateescape")
    specs = {}
    for cls in MODELS:
        name = f"{cls}{payload('FILE', file_name=True)}.yaml"
        path = work / name
        path.write_text(SPEC.format(name=json.dumps(p["SPEC"]), cls=cls), encoding="utf-8")
        specs[cls] = path
    return specs


MAKE_DIFF_PAIR = """\
import json
try:
    from layerlab.text_safety import clean
except ImportError:  # a layerlab from before it: its JSON holds the raw text
    def clean(text, **_):
        return text
hostile, cleaned = {hostile!r}, clean({mod!r}, newlines=True, limit=10_000)

def walk(v, scale):
    if isinstance(v, str):
        return v.replace(cleaned, hostile)
    if isinstance(v, float):
        return v * scale + (scale - 1)
    if isinstance(v, list):
        return [walk(x, scale) for x in v]
    if isinstance(v, dict):
        return {{walk(k, 1): walk(x, scale) for k, x in v.items()}}
    return v

a = json.load(open("inspect.json", encoding="utf-8"))
for name, scale in (({a_name!r}, 1), ("B.json", 2)):
    with open(name, "w", encoding="ascii") as f:
        json.dump(walk(a, scale), f)
"""


def diff_pair(work: Path) -> Tuple[dict, Path, Path]:
    """The job that makes the two JSON reports ``diff`` compares: ``inspect --json`` of the model,
    its module names replaced by the raw payload (JSON-escaped in the file), B with other numbers;
    A's file name holds the payload too."""
    a = work / f"A{payload('FILE', file_name=True)}.json"
    code = MAKE_DIFF_PAIR.format(hostile=payload("JSONF"), mod=payload("MOD"), a_name=a.name)
    return {"python": code}, a, work / "B.json"


def jobs(work: Path, specs: Dict[str, Path], commands: Iterable[str], extra: bool = True) -> List[dict]:
    out = []
    env_pipe = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "1000", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    env_tty = {"TERM": "xterm-256color", "COLUMNS": "1000", "LINES": "50", "OMP_NUM_THREADS": "1",
               "PYTHONHASHSEED": "0", "FORCE_COLOR": "1"}
    lines: List[Tuple[str, str, Optional[List[str]], Optional[str]]] = []
    for command in commands:
        argv = COMMANDS[command]
        for cls in MODELS:
            if argv is None:
                lines.append((command, cls, None, PYTHON.format(cls=cls)))
            else:
                lines.append((command, cls, [str(specs[cls]) if a == "{spec}" else a for a in argv], None))
    prepare = []
    if extra:
        make, pa, pb = diff_pair(work)
        prepare = [{"id": "prepare|inspect.json", "cwd": str(work), "tty": False, "env": env_pipe, "timeout": 120,
                    "argv": ["inspect", str(specs["Evil"]), "--allow-import", "--json"], "save_stdout": "inspect.json"},
                   {"id": "prepare|diff pair", "cwd": str(work), "tty": False, "env": env_pipe, "timeout": 60, **make}]
        lines.append(("diff", "-", ["diff", str(pa), str(pb)], None))
        lines.append(("explain-shape", "-", ["explain-shape", "--op", payload("ARG"), "--input", "32"], None))
    for command, cls, argv, python in lines:
        for tty in (False, True):
            for as_json in (False, True):
                if python is not None and as_json:
                    continue
                job = {"id": f"{command}|{cls}|{'pty' if tty else 'pipe'}|{'json' if as_json else 'human'}",
                       "cwd": str(work), "tty": tty, "env": env_tty if tty else env_pipe,
                       "unset": ["NO_COLOR"] if tty else ["FORCE_COLOR"], "timeout": 120}
                if python is not None:
                    job["python"] = python
                else:
                    job["argv"] = argv + (["--json"] if as_json else [])
                out.append(job)
    return prepare + out


def run_jobs(job_list: List[dict], pythonpath: str, work: Path) -> List[dict]:
    jobs_file, results_file = work / "jobs.json", work / "results.json"
    jobs_file.write_text(json.dumps(job_list), encoding="ascii")
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(RUNNER), str(jobs_file), str(results_file)], env=env, cwd=str(work),
                   timeout=60 * len(job_list) + 120, check=True)
    return [r for r in json.loads(results_file.read_text(encoding="utf-8")) if not r["id"].startswith("prepare|")]


def judge(result: dict) -> Dict[str, List[str]]:
    """What leaked in one run, by place tag (``"*"`` for the run as a whole)."""
    leaks: Dict[str, List[str]] = defaultdict(list)
    raw = (result["stdout"] + result["stderr"]).encode("latin-1")
    tty = "|pty|" in result["id"]
    if result["timed_out"]:
        leaks["*"].append("timed out")
    if b"Traceback (most recent call last)" in raw:
        leaks["*"].append("traceback")
    if b"Exception ignored" in raw or result["rc"] == 120:
        leaks["*"].append("failed flush at exit")
    if result["id"].endswith("pipe|json") and not result["timed_out"]:  # a pty has one stream for both
        problem = _json_problem(result)
        if problem:
            leaks["*"].append(problem)
    plain = (CSI_SGR.sub(b"", raw) if tty else raw).decode("utf-8", errors="replace")
    squeezed = _squeeze(plain)
    python_job = result["id"].startswith("verify (Python)")
    for tag in TAGS:
        if python_job and tag == "WARN":  # in a script, Python itself prints the model's warnings
            continue
        for part in parts():
            for never in part["never"]:
                if never in plain and _near(plain, never, tag):
                    leaks[tag].append(f"{part['id']}: raw {never!r}")
            alone = part.get("interpreted_if_alone")
            if alone:  # shown literally, the marker follows the tag's closing "]"; interpreted, it does not
                marker = alone.replace("{tag}", tag)
                if any(squeezed[max(0, m.start() - 1):m.start()] not in ("]", "…")
                       for m in re.finditer(re.escape(marker), squeezed)):
                    leaks[tag].append(f"{part['id']}: markup interpreted")
            start = part.get("no_line_starts_with")
            if start and any(line.lstrip(" │|").startswith(start.replace("{tag}", tag)) for line in plain.splitlines()):
                leaks[tag].append(f"{part['id']}: forged line")
    return leaks


def _squeeze(text: str) -> str:
    """``text`` without whitespace and table borders: a field wrapped over lines of a table cell
    reads as one again."""
    return re.sub(r"[\s│┃|]+", "", text)


def _json_problem(result: dict) -> Optional[str]:
    """Under ``--json`` stdout is one JSON document, or empty with an error object last on stderr."""
    try:
        out = result["stdout"].encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:  # a file name that was not UTF-8, written as its bytes
        return "stdout is not valid UTF-8"
    if out.strip():
        try:
            json.loads(out)
        except ValueError:
            return "stdout is not one JSON document"
        return None
    lines = [line for line in result["stderr"].encode("latin-1").decode("utf-8", "replace").splitlines() if line.strip()]
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        last = None
    if result["rc"] == 0 or not isinstance(last, dict) or "error" not in last:
        return "no JSON on stdout, and no JSON error on stderr"
    return None


def _near(plain: str, never: str, tag: str) -> bool:
    """``never`` occurs in the payload of ``tag``: within a few characters of the tag's markers
    (a run's output holds several places' payloads)."""
    for m in re.finditer(re.escape(never), plain):
        window = plain[max(0, m.start() - 120): m.end() + 120]
        if tag in window:
            return True
    return False


#: the parts whose visible form says that a place's text reached the output, made safe
VISIBLE_PARTS = ("esc_clear", "markup_style", "markup_link")


def visible(result: dict, tag: str) -> bool:
    """Does the run show the place's payload, made visible (escapes and literal markup)?"""
    out, err = (result[k].encode("latin-1") for k in ("stdout", "stderr"))
    if result["id"].endswith("|json"):  # the text inside the JSON strings, not their JSON escapes
        texts = [_json_strings(CSI_SGR.sub(b"", s).decode("utf-8", errors="replace")) for s in (out, err)]
        plain = "\n".join(t for group in texts for t in group)
    else:
        plain = CSI_SGR.sub(b"", out + err).decode("utf-8", errors="replace")
    squeezed = _squeeze(plain)
    for part in parts():
        if part["id"] not in VISIBLE_PARTS:
            continue
        shown = (part.get("file_name_shown") if tag == "FILE" else None) or part["shown"]
        if _squeeze(shown.replace("{tag}", tag)) not in squeezed:
            return False
    return True


def _json_strings(text: str) -> List[str]:
    """Every string (keys too) of the JSON documents in ``text``: the whole text, else each line."""
    docs = []
    for chunk in [text] + text.splitlines():
        try:
            docs.append(json.loads(chunk))
        except ValueError:
            continue
        if chunk is text:
            break
    out: List[str] = []
    stack = list(docs)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out.extend(k for k in v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


def run_matrix(pythonpath: str, commands: Iterable[str], extra: bool = True,
               keep: Optional[Callable[[str], bool]] = None) -> List[dict]:
    """Run the jobs (those whose id ``keep`` accepts) with the layerlab on ``pythonpath``."""
    with tempfile.TemporaryDirectory(prefix="layerlab-injection-") as tmp:
        work = Path(tmp)
        specs = setup(work)
        job_list = [j for j in jobs(work, specs, commands, extra) if keep is None or keep(j["id"])]
        return run_jobs(job_list, pythonpath, work)


def cells(results: List[dict]) -> Dict[Tuple[str, str], List[str]]:
    """(place, command) → what leaked there, over every model, stream and mode."""
    out: Dict[Tuple[str, str], List[str]] = defaultdict(list)
    for r in results:
        command = r["id"].split("|")[0]
        for tag, what in judge(r).items():
            out[(tag, command)].extend(f"{r['id']}: {w}" for w in what)
    return out


def main(argv: List[str]) -> int:
    pythonpath = argv[0] if argv else str(REPO)
    results = run_matrix(pythonpath, list(COMMANDS))
    leaked = cells(results)
    commands = sorted({r["id"].split("|")[0] for r in results})
    tags = ("*",) + TAGS
    shown = {(tag, r["id"].split("|")[0]) for r in results for tag in tags[1:] if visible(r, tag)}
    print(f"layerlab from {pythonpath}: {len(results)} runs")
    print(f"{'command':18}" + "".join(f"{t:>7}" for t in tags))
    for c in commands:
        print(f"{c:18}" + "".join(f"{('LEAK' if leaked.get((t, c)) else ('shown' if (t, c) in shown else '-')):>7}"
                                  for t in tags))
    n = sum(1 for v in leaked.values() if v)
    print(f"cells (place × command) that leaked: {n}")
    for key, what in sorted(leaked.items()):
        if what:
            print(key, what[:3], f"(+{len(what) - 3})" if len(what) > 3 else "")
    print("slowest runs:", sorted(((r["seconds"], r["id"]) for r in results), reverse=True)[:5])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
