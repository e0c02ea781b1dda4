"""The third audit's Hugging Face models, built from tiny configs (never downloaded), fed wrong
inputs (tests/probe/test_audit_round3.py): one realistic one-line bug each.

Every case returns ``(broken, inputs, hand_fixed)``: ``inputs`` is a tuple of positional arguments
or a dict of keyword arguments; ``hand_fixed`` is the model a user would write after the right
fix, sharing the broken model's weights where that fix keeps them (``None`` where the fix changes
a layer's size: the test then copies the verified copy's weights into its own hand-fixed model).
"""
import copy
import torch
import torch.nn as nn

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def tiny_bert(cls_name: str = "BertModel", **extra):
    """A one-layer BERT (hidden 32, 32 positions) of class ``cls_name``, seeded, in eval mode."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=37, max_position_embeddings=32, **extra)
    return getattr(transformers, cls_name)(cfg).eval()


@case
def c22_hf_bert_float_ids():
    m = tiny_bert()
    ids = torch.randint(0, 99, (2, 7)).float()   # BUG: ids through a float tensor
    class F_(nn.Module):
        def __init__(s): super().__init__(); s.m = copy.deepcopy(m)
        def forward(s, ids): return s.m(ids.long())
    return m, (ids,), F_()


@case
def c23_hf_vit_nhwc():
    from transformers import ViTConfig, ViTModel
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=37)
    m = ViTModel(cfg).eval()
    class F_(nn.Module):
        def __init__(s): super().__init__(); s.m = copy.deepcopy(m)
        def forward(s, px): return s.m(px.permute(0, 3, 1, 2))
    return m, (torch.randn(2, 16, 16, 3),), F_()


@case
def c24_hf_float_labels():
    m = tiny_bert("BertForSequenceClassification", num_labels=3)
    ids = torch.randint(0, 99, (2, 7))
    labels = torch.tensor([0., 2.])   # BUG: class labels stored as float -> HF picks multi_label (BCE)
    class F_(nn.Module):
        def __init__(s): super().__init__(); s.m = copy.deepcopy(m)
        def forward(s, input_ids, labels): return s.m(input_ids=input_ids, labels=labels.long())
    return m, dict(input_ids=ids, labels=labels), F_()


@case
def c25_hf_bert_too_long():
    m = tiny_bert()
    return m, (torch.randint(0, 99, (2, 40)),), None
