"""A spec's meta-device memory estimate runs without importing torch._dynamo, and leaves no trace.

torch's meta kernels are Python references wrapped in ``torch._disable_dynamo``, whose first call
imports torch._dynamo (about 1 s). The estimate runs them under a stand-in
(:mod:`layerlab.spec.dynamo_stub`); these tests check, each in a fresh interpreter (the import is
once per process), that nothing imports dynamo, that the estimate still refuses what cannot fit,
and that afterwards torch._dynamo imports and marks the same functions as it would have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_MARKED = """
import gc, types
def marked():
    return [f for f in gc.get_objects() if isinstance(f, types.FunctionType) and "__dynamo_disable" in vars(f)]
"""


def test_resolving_a_spec_imports_no_dynamo_and_marks_nothing_then_dynamo_marks_as_usual():
    found = _run(_MARKED + """
import json, sys
from layerlab.target.build import resolve
resolve("configs/cnn_block.yaml", reference=False)  # Linear (addmm) and BatchNorm: Python meta kernels
after_resolve = ("torch._dynamo" in sys.modules, len(marked()))
import torch, torch._dynamo
x = torch.empty(8, 16, device="meta")
torch.nn.functional.linear(x, torch.empty(4, 16, device="meta"), torch.empty(4, device="meta"))  # addmm
real = marked()
print(json.dumps({"after": after_resolve, "real": len(real),
                  "wrapped": all(vars(f)["__dynamo_disable"] is not f for f in real)}))
""")
    assert found["after"] == [False, 0]
    assert found["real"] > 0 and found["wrapped"]  # torch's own disable() marked them, as without layerlab


def test_the_estimate_still_refuses_an_intermediate_that_cannot_fit():
    found = _run("""
import json, sys
from layerlab.errors import SpecError
from layerlab.spec.load import parse_yaml
from layerlab.target.build import from_spec
import tempfile, os
text = "layer: Upsample\\nargs: {scale_factor: 4096, mode: nearest}\\ninput: {shape: [1, 64, 64, 64]}\\n"
path = os.path.join(tempfile.mkdtemp(), "big.yaml")
open(path, "w").write(text)
try:
    from layerlab.target.build import resolve
    resolve(path, reference=False)
    result = "built"
except SpecError as e:
    result = str(e)
print(json.dumps({"result": result, "dynamo": "torch._dynamo" in sys.modules}))
""")
    assert "intermediate" in found["result"] and "upsample" in found["result"].lower(), found
    assert found["dynamo"] is False


def test_it_stands_aside_when_dynamo_is_imported_or_another_thread_runs():
    found = _run("""
import json, sys, threading
from layerlab.spec.dynamo_stub import no_dynamo_import
stop = threading.Event()
t = threading.Thread(target=stop.wait); t.start()
with no_dynamo_import() as with_thread:
    pass
stop.set(); t.join()
with no_dynamo_import() as alone:
    import torch._dynamo as inside
    stub = "stand-in" in (inside.__doc__ or "")
after = "torch._dynamo" in sys.modules
import torch._dynamo
with no_dynamo_import() as imported:
    pass
print(json.dumps({"thread": with_thread, "alone": alone, "stub": stub, "after": after, "imported": imported}))
""")
    assert found == {"thread": False, "alone": True, "stub": True, "after": False, "imported": False}


def test_code_that_needs_more_of_dynamo_or_keeps_the_stand_in_gets_the_real_module():
    found = _run("""
import json, sys
from layerlab.spec.dynamo_stub import no_dynamo_import
def f(x):
    return x
with no_dynamo_import() as stood_in:
    import torch._dynamo as kept          # a module first imported in the window binds the stand-in
    cheap = kept.disable(f) is f          # the one thing it stands in for
with no_dynamo_import() as again:
    import torch._dynamo as kept2
    config = kept2.config                 # anything else: the real module, imported now
    real_in_window = type(sys.modules["torch._dynamo"]).__name__ == "module"
after = kept.disable(f)                   # the kept reference, after the window: the real disable
print(json.dumps({"stood_in": stood_in, "cheap": cheap, "again": again,
                  "config": type(config).__name__, "real_in_window": real_in_window,
                  "real_after": after is not f and callable(after),
                  "module": type(sys.modules["torch._dynamo"]).__name__}))
""")
    assert found["stood_in"] and found["cheap"] and found["again"]
    assert found["config"] != "NoneType" and found["real_in_window"] and found["real_after"]
    assert found["module"] == "module"
