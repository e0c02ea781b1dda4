"""Audit of ``layerlab diff``'s verdicts against the truth, measured with plain torch.

For every pair of models the truth is computed here, not written down: forward hooks record every
module call's input and output tensors in A and in B (aligned by path and call number), and the
origins are the innermost calls whose inputs are equal (``torch.allclose`` at the diff's own
tolerance) and whose outputs are not. ``layerlab.diff`` only sees five statistics per tensor, so the
traps here are the cases where statistics lie: a transpose or flip made by a parent's own code keeps
mean, std, min, max and zeros, and must not make the child look like the origin.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import layerlab  # noqa: E402
from layerlab.report_diff.load import ReportError  # noqa: E402

RTOL, ATOL = 1e-4, 1e-6


# -- the truth, with plain torch hooks ------------------------------------------------------------

def _tensors(obj):
    if torch.is_tensor(obj):
        return [obj.detach().clone()]
    if isinstance(obj, dict):
        return [t for k in sorted(obj) for t in _tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if hasattr(obj, "to_tuple"):  # a transformers ModelOutput
        return _tensors(obj.to_tuple())
    return []


def _record(model, inputs, mode):
    """[(path, call number, parent index, inputs, outputs)] of every module call, in call order."""
    names = {}
    for name, m in model.named_modules():
        names.setdefault(id(m), name)
    calls, stack, counts = [], [], {}

    def pre(m, args, kwargs):
        path = names[id(m)]
        counts[path] = counts.get(path, 0) + 1
        calls.append([path, counts[path], stack[-1] if stack else None, _tensors((args, kwargs)), None])
        stack.append(len(calls) - 1)

    def post(m, args, kwargs, out):
        calls[stack.pop()][4] = _tensors(out)

    handles = [h for m in model.modules() for h in (m.register_forward_pre_hook(pre, with_kwargs=True),
                                                    m.register_forward_hook(post, with_kwargs=True))]
    was = model.training
    model.train(mode == "train")
    try:
        torch.manual_seed(0)
        model(*inputs)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return calls


def _equal(xs, ys):
    return len(xs) == len(ys) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and (torch.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True) if x.is_floating_point() else torch.equal(x, y))
        for x, y in zip(xs, ys))


def truth(a, b, xa, xb, mode):
    """(origin labels, whether any call's output differs) measured on the tensors themselves."""
    ca, cb = _record(a, xa, mode), _record(b, xb, mode)
    by_key = {(c[0], c[1]): c for c in cb}
    differs = len(ca) != len(cb)
    hits = set()
    for i, (path, n, _, ins, outs) in enumerate(ca):
        other = by_key.get((path, n))
        if other is None or not _equal(outs, other[4]):
            differs = True
            if other is not None and _equal(ins, other[3]):
                hits.add(i)
    enclosing = set()
    for i in hits:
        p = ca[i][2]
        while p is not None:
            enclosing.add(p)
            p = ca[p][2]
    labels = []
    for i in sorted(hits - enclosing):
        path, n = ca[i][0] or "(root)", ca[i][1]
        labels.append(path if n == 1 else f"{path} (call {n})")
    return labels, differs


# -- the models -----------------------------------------------------------------------------------

def _scaled(model, param, by=1.5):
    with torch.no_grad():
        model.get_parameter(param).mul_(by)
    return model


class Block(nn.Module):
    """A ResNet basic block; ``res_scale`` and ``transpose`` change only the block's own forward code."""

    def __init__(self, c, res_scale=1.0, transpose=False):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu, self.res_scale, self.transpose = nn.ReLU(), res_scale, transpose

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        if self.transpose:  # square feature maps: the statistics of h are unchanged
            h = h.transpose(-1, -2)
        return self.relu(x + self.res_scale * self.bn2(self.conv2(h)))


def resnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Block(4), Block(4), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 3))


class CodeMade(nn.Module):
    """``b``'s input is made by plain torch code: ``h * 1.0``, or ``h.flip(-1)`` (same statistics)."""

    def __init__(self, flip=False):
        super().__init__()
        self.a, self.b, self.flip = nn.Linear(8, 8), nn.Linear(8, 4), flip

    def forward(self, x):
        h = self.a(x)
        return self.b(h.flip(-1) if self.flip else h * 1.0)


class Shared(nn.Module):
    """One Linear called twice; ``flip`` reorders only what its second call gets."""

    def __init__(self, flip=False):
        super().__init__()
        self.shared, self.mid, self.act, self.flip = nn.Linear(8, 8), nn.Linear(8, 8), nn.Tanh(), flip

    def forward(self, x):
        h = self.act(self.mid(self.act(self.shared(x))))
        return self.shared(h.flip(-1) if self.flip else h)


def _seeded(make):
    torch.manual_seed(0)
    return make()


def _with(model, **attrs):
    model = copy.deepcopy(model)
    for path_attr, value in attrs.items():
        path, _, attr = path_attr.rpartition("__")
        setattr(model.get_submodule(path.replace("__", ".")) if path else model, attr, value)
    return model


def pair_encoder_linear2():
    a = _seeded(lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2,
                                              enable_nested_tensor=False))
    return a, _scaled(copy.deepcopy(a), "layers.1.linear2.weight"), (torch.randn(2, 5, 16),), None, "eval"


def pair_resnet_conv():
    a = resnet()
    return a, _scaled(copy.deepcopy(a), "2.conv2.weight", 1.3), (torch.randn(2, 3, 8, 8),), None, "eval"


def pair_relu_to_gelu():
    a = _seeded(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    b = copy.deepcopy(a)
    b[1] = nn.GELU()
    return a, b, (torch.randn(5, 8),), None, "eval"


def pair_residual_scale():
    a = resnet()
    return a, _with(a, **{"1__res_scale": 0.5}), (torch.randn(2, 3, 8, 8),), None, "eval"


def pair_transpose_in_parent():
    a = resnet()
    return a, _with(a, **{"1__transpose": True}), (torch.randn(2, 3, 8, 8),), None, "eval"


def pair_flip_made_by_code():
    a = _seeded(lambda: nn.Sequential(nn.Linear(8, 8), CodeMade()))
    return a, _with(a, **{"1__flip": True}), (torch.randn(4, 8),), None, "eval"


def pair_child_of_code_made_input_changed():
    a = _seeded(lambda: nn.Sequential(nn.Linear(8, 8), CodeMade()))
    return a, _scaled(copy.deepcopy(a), "1.b.weight"), (torch.randn(4, 8),), None, "eval"


def pair_batchnorm_running_stats():
    a = _seeded(lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                                      nn.Linear(144, 2)))
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[1].running_mean.add_(0.3)
        b[1].running_var.mul_(2)
    return a, b, (torch.randn(2, 3, 8, 8),), None, "eval"


def pair_shared_second_call_after_changed_layer():
    a = _seeded(Shared)
    return a, _scaled(copy.deepcopy(a), "mid.weight"), (torch.randn(4, 8),), None, "eval"


def pair_shared_second_call_reordered_by_parent():
    a = _seeded(Shared)
    return a, _with(a, flip=True), (torch.randn(4, 8),), None, "eval"


def pair_input_differs():
    a = _seeded(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    x = torch.randn(5, 8)
    return a, copy.deepcopy(a), (x,), (x + 0.1,), "eval"


def pair_added_layer():
    a = _seeded(lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    return a, nn.Sequential(*copy.deepcopy(a), nn.Tanh()), (torch.randn(5, 8),), None, "eval"


def pair_hf_bert_intermediate():
    transformers = pytest.importorskip("transformers", reason="a tiny BERT from a config needs transformers")
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16)
    a = _seeded(lambda: transformers.BertModel(cfg))
    b = _scaled(copy.deepcopy(a), "encoder.layer.1.intermediate.dense.weight")
    return a, b, (torch.randint(0, 50, (2, 6)),), None, "eval"


PAIRS = [pair_encoder_linear2, pair_resnet_conv, pair_relu_to_gelu, pair_residual_scale, pair_transpose_in_parent,
         pair_flip_made_by_code, pair_child_of_code_made_input_changed, pair_batchnorm_running_stats,
         pair_shared_second_call_after_changed_layer, pair_shared_second_call_reordered_by_parent,
         pair_input_differs, pair_added_layer, pair_hf_bert_intermediate]


def _diff(a, b, xa, xb, mode):
    return layerlab.diff(layerlab.inspect(a, *xa, mode=mode), layerlab.inspect(b, *(xb or xa), mode=mode))


@pytest.mark.parametrize("make", PAIRS, ids=lambda f: f.__name__[5:])
def test_origin_is_the_innermost_call_with_equal_inputs_and_different_outputs(make):
    a, b, xa, xb, mode = make()
    origins, differs = truth(a, b, xa, xb or xa, mode)
    d = _diff(a, b, xa, xb, mode)
    assert d.differs is differs
    assert d.origins == origins, d.notes


def test_a_reorder_by_the_parent_is_not_blamed_on_the_child_and_a_note_says_why():
    a, b, x, _, mode = pair_transpose_in_parent()
    assert truth(a, b, x, x, mode)[0] == ["1"]
    d = _diff(a, b, x, None, mode)
    assert d.origins == ["1"]
    note = next(n for n in d.notes if n.startswith("1.conv2:"))
    assert "output of 1.relu in A" in note and "plain torch code in the forward of 1 in B" in note


@pytest.mark.parametrize("make, param", [(pair_encoder_linear2, "layers.1.linear2.weight"),
                                         (pair_resnet_conv, "2.conv2.weight"),
                                         (pair_shared_second_call_after_changed_layer, "mid.weight")])
def test_the_changed_weight_is_ranked_first_with_its_real_norms(make, param):
    a, b, x, _, mode = make()
    d = _diff(a, b, x, None, mode)
    top = d.changes[0]
    assert (top.where, top.what) == (param, "norm")
    assert top.a == pytest.approx(a.get_parameter(param).norm().item(), rel=1e-6)
    assert top.b == pytest.approx(b.get_parameter(param).norm().item(), rel=1e-6)
    # the projection loss is a consequence of every output: it comes after every other number
    whats = [(c.section, c.what) for c in d.changes]
    assert ("backward", "loss") in whats and whats[-1] == ("backward", "loss")


def test_a_different_model_input_is_ranked_first_and_names_no_origin():
    a, b, xa, xb, mode = pair_input_differs()
    d = _diff(a, b, xa, xb, mode)
    assert d.origins == [] and any("inputs differ" in n for n in d.notes)
    assert (d.changes[0].section, d.changes[0].what) == ("inputs", "input mean")
    assert d.changes[0].b == pytest.approx(xb[0].mean().item(), rel=1e-5)


def _encoder():
    return _seeded(lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                                 enable_nested_tensor=False))


def test_identical_computations_show_no_difference_dropout_and_thread_count_included():
    model, x = _encoder(), torch.randn(3, 7, 32)
    assert truth(model, copy.deepcopy(model), (x,), (x,), "train") == ([], False)  # dropout, same seed
    a = layerlab.inspect(model, x, mode="train")
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        b = layerlab.inspect(copy.deepcopy(model), x, mode="train")
    finally:
        torch.set_num_threads(threads)
    d = layerlab.diff(a, b)
    assert not d.differs and d.changes == [] and d.origins == [], [(c.where, c.what, c.a, c.b) for c in d.changes]


def test_a_changed_layer_is_found_whatever_the_thread_count():
    a, b, x, _, mode = pair_encoder_linear2()
    threads = torch.get_num_threads()
    ra = layerlab.inspect(a, *x, mode=mode)
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        rb = layerlab.inspect(b, *x, mode=mode)
    finally:
        torch.set_num_threads(threads)
    assert layerlab.diff(ra, rb).origins == truth(a, b, x, x, mode)[0] == ["layers.1.linear2"]


def test_malformed_json_and_reports_of_different_kinds_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 1,\n  "calls": [1, 2,,]\n}\n')
    linear, x = _seeded(lambda: nn.Linear(3, 2)), torch.randn(2, 3)
    good = layerlab.inspect(linear, x).to_dict()
    with pytest.raises(ReportError, match="is not valid JSON") as info:
        layerlab.diff(str(bad), good)
    assert info.value.where == f"{bad}:2:18"  # the second comma of [1, 2,,]
    # report.to_dict() keeps its call records as objects: it is a report all the same
    same = layerlab.diff(good, layerlab.inspect(linear, x))
    assert not same.differs and same.changes == []
    profile = dict(good, kind="profile-report")
    with pytest.raises(ReportError, match="cannot compare an inspect report with a profile report"):
        layerlab.diff(good, profile)


class CodeMadeNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.a(x) * 1.0)


def pair_channel_shuffle_groups():
    a = _seeded(lambda: nn.Sequential(nn.Conv2d(3, 8, 1), nn.ChannelShuffle(2), nn.Conv2d(8, 4, 1)))
    b = copy.deepcopy(a)
    b[1] = nn.ChannelShuffle(4)  # same class, no parameters, same output statistics
    return a, b, (torch.randn(2, 3, 5, 5),), None, "eval"


def pair_running_stats_behind_code_made_input():
    a = _seeded(CodeMadeNorm)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.bn.running_mean.add_(0.5)  # buffers are not in the report: nothing in bn looks changed
    return a, b, (torch.randn(4, 8),), None, "eval"


@pytest.mark.parametrize("make, doubted", [(pair_channel_shuffle_groups, "2"),
                                           (pair_running_stats_behind_code_made_input, "bn")],
                         ids=["channel_shuffle", "running_stats"])
def test_where_statistics_cannot_tell_an_enclosing_call_is_named_never_a_wrong_one(make, doubted):
    a, b, x, _, mode = make()
    (origin,), differs = truth(a, b, x, x, mode)
    d = _diff(a, b, x, None, mode)
    assert d.differs and differs
    # the named call contains the true origin (coarser, not wrong) ...
    assert len(d.origins) == 1 and (d.origins[0] == "(root)" or origin.startswith(d.origins[0] + "."))
    # ... and a note names the call statistics alone would have blamed, and why it is not named
    assert any(n.startswith(f"{doubted}:") and "matches A's only in its statistics" in n for n in d.notes), d.notes
