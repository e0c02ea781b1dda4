"""The silent-bug rules over every correct model the project's stock sweeps use: any finding is a false alarm.

Sources: the Hugging Face architecture sweep (``tests/hf/test_architecture_sweep.py``), the second
stock sweep's models (``tests/stock_sweep_models.py``), torch's ``module_db`` samples
(``tests/checks/module_db_sweep.py``), the stock torch.nn configurations
(``tests/checks/stock_configs.py``), the models of ``tests/probe/test_stock_models.py`` and
``test_probes_stock_sweep.py``, the benchmark's reference models, and every ``configs/*.yaml``
spec that builds without --allow-import (the user-code ones with it: they are the project's own
correct examples).

Each model runs its forward once under the provenance mode, as ``inspect`` runs it (pass 1; pass 2
where pass 1 asks for it). Runnable as a script for the table: ``python -m tests.engine.silent_sweep``.
"""

from __future__ import annotations

import copy
import glob
import os
import sys
from typing import Callable, Dict, Iterator, List, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Entry = Tuple[str, Callable[[], Tuple[torch.nn.Module, tuple, dict]]]


def silent_of(model: torch.nn.Module, args: tuple, kwargs: dict) -> List[str]:
    """``["rule at line: message"]`` for one forward of ``model`` (an exception of the model: [])."""
    from layerlab.engine import silent_check

    mode = silent_check.watch(model, args, kwargs)
    try:
        with mode:
            out = model(*args, **kwargs)
    except Exception:
        return []
    prov = silent_check.seen(mode, out)
    return [f"{f.code} at {f.where}: {f.message}" for f in silent_check.findings(prov, model, args, kwargs)]


def hf_entries() -> Iterator[Entry]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return
    sys.path.insert(0, ROOT)
    from tests.hf.test_architecture_sweep import BUILD
    from tests.stock_sweep_models import MODELS

    for name, build in BUILD.items():
        for mode in ("train", "eval"):
            yield f"hf-arch/{name}/{mode}", (lambda b=build, m=mode: _moded(b(), m))
    for name, build in MODELS.items():
        for mode in ("train", "eval"):
            yield f"hf-stock/{name}/{mode}", (lambda b=build, m=mode: _moded(b(), m))
    import transformers as tf

    def gpt2():
        torch.manual_seed(0)
        m = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=100))
        return m, (torch.randint(0, 100, (4, 32), generator=torch.Generator().manual_seed(0)),), {}

    def bert():
        torch.manual_seed(0)
        m = tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                       intermediate_size=64, vocab_size=100, max_position_embeddings=64))
        return m, (torch.randint(0, 100, (4, 32), generator=torch.Generator().manual_seed(0)),), {}

    for name, build in (("gpt2", gpt2), ("bert", bert)):
        for mode in ("train", "eval"):
            yield f"hf-probe/{name}/{mode}", (lambda b=build, m=mode: _moded(b(), m))


def _moded(built, mode):
    model, args, kwargs = built
    return model.train(mode == "train"), args, kwargs


def torch_entries() -> Iterator[Entry]:
    sys.path.insert(0, ROOT)
    import torch.nn as nn
    from tests.checks.stock_configs import ENTRIES

    for id_, build, inputs, kwargs, _ in ENTRIES:
        for mode in ("train", "eval"):
            yield f"stock/{id_}/{mode}", (lambda b=build, i=inputs, k=kwargs, m=mode: (b().train(m == "train"), i(), k))

    def encoder(batch_first):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()

    yield "stock-models/encoder", lambda: (encoder(True), (torch.randn(2, 7, 32),), {})
    yield "stock-models/encoder-seq-first", lambda: (encoder(False), (torch.randn(7, 2, 32),), {})
    yield "stock-models/transformer", lambda: (nn.Transformer(32, 4, 1, 1, 64, batch_first=True),
                                               (torch.randn(2, 7, 32), torch.randn(2, 5, 32)), {})
    yield "stock-models/lstm", lambda: (nn.LSTM(8, 16, 2, batch_first=True), (torch.randn(2, 5, 8),), {})
    sys.path.insert(0, os.path.join(ROOT, "tests", "benchmarks"))
    from bench_inspect import make_model

    for name in ("cnn", "transformer", "lstm", "minigpt"):
        yield f"bench/{name}", (lambda n=name: (*_small(make_model(n)), {}))


def _small(built):
    model, x = built
    return model, (x[:2],)


def module_db_entries(per_module: int = 3) -> Iterator[Entry]:
    import importlib.util

    if importlib.util.find_spec("expecttest") is None:  # torch's module_db needs it
        return
    sys.path.insert(0, ROOT)
    from tests.checks.module_db_sweep import _label, samples

    for s in samples(per_module):
        yield f"module_db/{_label(s)}", (lambda s=s: (s.build(), copy.deepcopy(s.args), copy.deepcopy(s.kwargs)))


def config_entries() -> Iterator[Entry]:
    from layerlab.target import resolve

    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
        name = os.path.basename(path)
        if name.startswith(("broken_", "silent_")):
            continue  # broken on purpose (they raise, or compute the wrong thing): not correct models

        def build(path=path):
            try:
                t = resolve(path, allow_import=True)
            except TypeError:
                t = resolve(path)
            pos, kw = t.split()
            return t.module, tuple(pos), dict(kw)

        yield f"configs/{name}", build


def entries(module_db: bool = True) -> Iterator[Entry]:
    yield from config_entries()
    yield from torch_entries()
    yield from hf_entries()
    if module_db:
        yield from module_db_entries()


def sweep(module_db: bool = True) -> Tuple[int, Dict[str, List[str]]]:
    """``(models run, {model: findings})`` over every entry that builds and runs."""
    found: Dict[str, List[str]] = {}
    n = 0
    for name, build in entries(module_db):
        try:
            model, args, kwargs = build()
        except Exception:
            continue
        n += 1
        hits = silent_of(model, args, kwargs)
        if hits:
            found[name] = hits
    return n, found


if __name__ == "__main__":
    total, hits = sweep(module_db="--no-module-db" not in sys.argv)
    for name, lines in hits.items():
        for line in lines:
            print(f"{name}: {line}")
    print(f"{total} models, {sum(len(v) for v in hits.values())} silent findings")
