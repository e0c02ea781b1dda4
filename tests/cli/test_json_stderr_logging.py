"""Under ``--json`` every stderr line parses: a library that logs in plain text through its own
handler (as transformers does: a StreamHandler made at import, propagate=False) is wrapped too."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_plain_text_logging_of_a_library_becomes_json_lines(tmp_path):
    (tmp_path / "chatty.py").write_text(textwrap.dedent("""
        import logging, sys
        import torch
        from torch import nn

        log = logging.getLogger("chatty_lib")
        log.addHandler(logging.StreamHandler())  # stderr, bound when the library is imported
        log.propagate = False

        class Chatty(nn.Module):
            def __init__(self):
                super().__init__()
                log.warning("[chatty] config looks odd: vocab 100")
                self.lin = nn.Linear(4, 3)

            def forward(self, x):
                return self.lin(x)
    """))
    (tmp_path / "spec.yaml").write_text("layer: ./chatty.py:Chatty\ninput: {shape: [2, 4]}\n")
    for command in ("inspect", "gradcheck"):
        done = subprocess.run([sys.executable, "-m", "layerlab", command, str(tmp_path / "spec.yaml"),
                               "--allow-import", "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        json.loads(done.stdout)
        lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
        assert any(entry.get("log") == "[chatty] config looks odd: vocab 100" for entry in lines), done.stderr
