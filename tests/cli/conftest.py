import pytest

from layerlab.cli.app import main


@pytest.fixture
def run(capsys, monkeypatch):
    """Run the CLI in-process at a fixed width with colour off: returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("LAYERLAB_DEBUG", raising=False)

    def _run(*args):
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run
