"""inspect's output files (--svg, --html, --plot): refused over an input, twice, or through a symbolic
link without --force (layerlab.output_files)."""

import textwrap


def test_svg_over_the_models_source_file_is_refused_before_the_run(run, tmp_path):
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent("""
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(x)
    """))
    spec = tmp_path / "net.yaml"
    spec.write_text("layer: ./model.py:Net\ninput: {shape: [2, 4]}\n")
    before = model.read_text()
    code, out, err = run("inspect", str(spec), "--allow-import", "--svg", str(model))
    assert code == 2, out + err
    assert "one of this run's inputs" in err and model.read_text() == before
    code, out, err = run("inspect", str(spec), "--allow-import", "--html", str(spec))
    assert code == 2 and spec.read_text().startswith("layer:")


def test_two_outputs_with_one_path_are_refused(run, tmp_path):
    code, out, err = run("inspect", "linear", "--svg", str(tmp_path / "a.svg"), "--html", str(tmp_path / "a.svg"))
    assert code == 2, out + err
    assert "--svg and --html name the same file" in err


def test_a_link_is_written_only_with_force(run, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "view.svg"
    link.symlink_to(victim)
    code, out, err = run("inspect", "linear", "--svg", str(link))
    assert code == 2, out + err
    assert "symbolic link" in err and victim.read_text() == "keep"
    code, out, err = run("inspect", "linear", "--svg", str(link), "--force")
    assert code == 0, out + err
    assert link.is_symlink() and victim.read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt", "view.svg"]  # no stray temporary file
