"""Models of real size for ``bench_inspect.py``, built here from torch.nn (no downloads, no torchvision).

* ``resnet18``   ResNet-18 (basic blocks 2-2-2-2, 11.7 M parameters), as torchvision builds it
* ``mobilenet``  MobileNetV3-small (11 inverted residuals with squeeze-excite and hard-swish, 2.5 M
                 parameters), as torchvision builds it: many small modules, the case where a fixed
                 cost per module call shows
* ``gpt2``       GPT-2 small (12 blocks, d 768, 124 M parameters) from ``transformers.GPT2Config()``
                 when transformers is installed, else a torch.nn pre-LN transformer of the same size
"""

from __future__ import annotations

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, cin, stages = (64, 128, 256, 512), 64, []
        for i, w in enumerate(widths):
            stages.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _divisible(v: float, d: int = 8) -> int:
    new = max(d, int(v + d / 2) // d * d)
    return new + d if new < 0.9 * v else new


class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, groups=1, act=nn.Hardswish):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    def __init__(self, cin, k, expanded, cout, se, act, stride) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers = []
        if expanded != cin:
            layers.append(ConvBNAct(cin, expanded, 1, act=act))
        layers.append(ConvBNAct(expanded, expanded, k, stride, groups=expanded, act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
        layers.append(ConvBNAct(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        out = self.block(x)
        return out + x if self.use_res_connect else out


_MOBILENET_V3_SMALL = [  # in, kernel, expanded, out, squeeze-excite, activation, stride
    (16, 3, 16, 16, True, nn.ReLU, 2), (16, 3, 72, 24, False, nn.ReLU, 2), (24, 3, 88, 24, False, nn.ReLU, 1),
    (24, 5, 96, 40, True, nn.Hardswish, 2), (40, 5, 240, 40, True, nn.Hardswish, 1),
    (40, 5, 240, 40, True, nn.Hardswish, 1), (40, 5, 120, 48, True, nn.Hardswish, 1),
    (48, 5, 144, 48, True, nn.Hardswish, 1), (48, 5, 288, 96, True, nn.Hardswish, 2),
    (96, 5, 576, 96, True, nn.Hardswish, 1), (96, 5, 576, 96, True, nn.Hardswish, 1),
]


class MobileNetV3Small(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers = [ConvBNAct(3, 16, 3, 2)] + [InvertedResidual(*cfg) for cfg in _MOBILENET_V3_SMALL]
        layers.append(ConvBNAct(96, 576, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(inplace=True), nn.Dropout(0.2),
                                        nn.Linear(1024, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TorchGPT2(nn.Module):
    """GPT-2 small's sizes in torch.nn (used when transformers is not installed)."""

    def __init__(self, vocab: int = 50257, d: int = 768, layers: int = 12, heads: int = 12, ctx: int = 1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T, device=ids.device))
        mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).triu(1)
        for block in self.h:
            x = block(x, mask)
        return self.ln_f(x)


def gpt2_small() -> nn.Module:
    try:
        from transformers import GPT2Config, GPT2Model
    except ImportError:
        return TorchGPT2()
    config = GPT2Config()
    config.use_cache = False
    return GPT2Model(config)


def make(name: str):
    """``(model, input)`` for one of the models above (train mode; seeded by the caller)."""
    if name == "resnet18":
        return ResNet18().train(), torch.randn(4, 3, 224, 224)
    if name == "mobilenet":
        return MobileNetV3Small().train(), torch.randn(8, 3, 224, 224)
    if name == "gpt2":
        return gpt2_small().train(), torch.randint(0, 50257, (1, 128))
    raise SystemExit(f"unknown model {name!r}")
