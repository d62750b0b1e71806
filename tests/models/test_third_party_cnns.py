"""CNN building blocks written the way public libraries write them (torchvision, timm, the
usual U-Net and FPN code), never seen by texelflow before: each must plan with no CPU fallback
and match eager PyTorch within 1e-4 of the output's largest value.

The modules are re-written here from the libraries' published structure (no torchvision or timm
import), small (few channels, small images, awkward sizes) so the whole file runs in seconds on
lavapipe. Norm layers get random statistics and affine terms so no branch is an identity.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import texelflow
from texelflow.demo import compare

TOLERANCE = 1e-4  # max |texelflow - eager| <= TOLERANCE * max |eager|


def randomized(model: nn.Module) -> nn.Module:
    """Random statistics and affine terms in every norm layer, random PReLU slopes; eval mode."""
    torch.manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.InstanceNorm1d,
                              nn.InstanceNorm2d)):
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm2d)) and \
                    m.running_mean is not None:
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
            if isinstance(m, nn.PReLU):
                m.weight.uniform_(-0.5, 0.5)
    return model.eval()


# ---- torchvision ResNet-50 bottleneck; ResNeXt / RegNet grouped convs ---------------------------
class Bottleneck(nn.Module):
    """torchvision's Bottleneck: 1x1 reduce, 3x3 (strided, grouped for ResNeXt), 1x1 expand by 4,
    a downsample branch (1x1 conv + BN) when the shape changes, then add and ReLU."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, groups=1, base_width=64, downsample=None):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def bottleneck_stage(inplanes, planes, blocks, stride, groups=1, base_width=64):
    downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4))
    layers = [Bottleneck(inplanes, planes, stride, groups, base_width, downsample)]
    layers += [Bottleneck(planes * 4, planes, 1, groups, base_width) for _ in range(1, blocks)]
    return nn.Sequential(*layers)


class ResNetStem(nn.Module):
    """conv 3x3 + BN + ReLU + max pool (the 7x7 stem, shrunk), then bottleneck stages."""

    def __init__(self, stages: nn.Module, cin=3, width=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(cin, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        self.stages = stages

    def forward(self, x):
        return torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1)


def resnet50_blocks():
    stages = nn.Sequential(bottleneck_stage(8, 4, 2, 1), bottleneck_stage(16, 6, 2, 2))
    return ResNetStem(stages), (torch.randn(2, 3, 29, 27),)


def resnext_blocks():
    """ResNeXt: cardinality 4 then 8 (groups of 2 and 3 channels, not depthwise)."""
    stages = nn.Sequential(bottleneck_stage(8, 4, 1, 1, groups=4, base_width=16),
                           bottleneck_stage(16, 5, 1, 2, groups=8, base_width=24))
    return ResNetStem(stages), (torch.randn(1, 3, 27, 31),)


class SqueezeExcite(nn.Module):
    """RegNetY / EfficientNet squeeze-excite: global mean, 1x1 reduce, activation, 1x1, sigmoid."""

    def __init__(self, channels, squeezed, act=nn.ReLU):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(self.act(self.fc1(s))))


class RegNetYBlock(nn.Module):
    """RegNetY's X block with SE: 1x1, grouped 3x3 (group width 3), SE, 1x1, projected shortcut."""

    def __init__(self, cin, cout, stride, group_width=3):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, stride, 1, groups=cout // group_width, bias=False),
                               nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.se = SqueezeExcite(cout, max(1, cin // 4))
        self.c = nn.Sequential(nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.proj(x) + self.c(self.se(self.b(self.a(x)))))


def regnety_blocks():
    model = nn.Sequential(nn.Conv2d(3, 6, 3, 2, 1), RegNetYBlock(6, 6, 1, 3), RegNetYBlock(6, 12, 2, 6),
                          RegNetYBlock(12, 16, 1, 8))
    return model, (torch.randn(2, 3, 15, 13),)


def grouped_convs():
    """Grouped convs of every shape conv2d's kernel tells apart: groups of whole texels (Cin/groups
    and Cout/groups multiples of 4, the ResNeXt / RegNet case), and groups of 2, 5 and 6 channels."""
    model = nn.Sequential(nn.Conv2d(12, 24, 3, 2, 1, groups=3), nn.ReLU(), nn.Conv2d(24, 16, 3, padding=2, dilation=2, groups=2),
                          nn.BatchNorm2d(16), nn.Conv2d(16, 16, 1, groups=4), nn.Conv2d(16, 10, 3, groups=2),
                          nn.Conv2d(10, 12, 1, groups=2), nn.Conv2d(12, 12, 3, padding=1, groups=2))
    return model, (torch.randn(2, 12, 13, 11),)


# ---- torchvision MobileNetV2 inverted residual ---------------------------------------------------
class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin, cout, kernel=3, stride=1, groups=1):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidualV2(nn.Module):
    """Expand 1x1 + ReLU6, depthwise 3x3 + ReLU6, linear 1x1 projection; residual at stride 1."""

    def __init__(self, cin, cout, stride, expand_ratio):
        super().__init__()
        hidden = int(round(cin * expand_ratio))
        self.use_res_connect = stride == 1 and cin == cout
        layers = [ConvBNReLU6(cin, hidden, 1)] if expand_ratio != 1 else []
        layers += [ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


def mobilenet_v2_blocks():
    model = nn.Sequential(ConvBNReLU6(3, 8, stride=2), InvertedResidualV2(8, 5, 1, 1), InvertedResidualV2(5, 7, 2, 6),
                          InvertedResidualV2(7, 7, 1, 6), ConvBNReLU6(7, 12, 1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(12, 5))
    return model, (torch.randn(2, 3, 23, 17),)


# ---- EfficientNet-B0 MBConv --------------------------------------------------------------------
class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth in "row" mode: identity in eval."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class MBConv(nn.Module):
    """Expand 1x1 + SiLU, depthwise kxk + SiLU, squeeze-excite (SiLU, sigmoid), project 1x1;
    stochastic depth on the residual."""

    def __init__(self, cin, cout, kernel, stride, expand_ratio, sd_prob=0.1):
        super().__init__()
        hidden = cin * expand_ratio
        layers = []
        if expand_ratio != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.SiLU(inplace=True),
                   SqueezeExciteTV(hidden, max(1, cin // 4)),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout
        self.stochastic_depth = StochasticDepth(sd_prob)

    def forward(self, x):
        out = self.block(x)
        return self.stochastic_depth(out) + x if self.use_res_connect else out


class SqueezeExciteTV(nn.Module):
    """torchvision.ops.SqueezeExcitation: AdaptiveAvgPool2d(1), fc1, SiLU, fc2, sigmoid scale."""

    def __init__(self, channels, squeezed):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)
        self.activation = nn.SiLU()
        self.scale_activation = nn.Sigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


def efficientnet_b0_blocks():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(inplace=True),
                          MBConv(8, 8, 3, 1, 1), MBConv(8, 12, 3, 2, 6), MBConv(12, 12, 5, 1, 6),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2, inplace=True), nn.Linear(12, 7))
    return model, (torch.randn(1, 3, 25, 21),)


# ---- torchvision DenseNet dense block and transition ----------------------------------------------
class DenseLayer(nn.Module):
    """BN-ReLU-conv1x1 (bottleneck), BN-ReLU-conv3x3 producing `growth` new channels."""

    def __init__(self, cin, growth, bn_size=2):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features):
        x = torch.cat(features, 1)
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers, cin, growth):
        super().__init__()
        for i in range(layers):
            self.add_module(f"denselayer{i + 1}", DenseLayer(cin + i * growth, growth))

    def forward(self, x):
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, cout, 1, bias=False),
                         nn.AvgPool2d(2, 2))


def densenet_blocks():
    model = nn.Sequential(nn.Conv2d(3, 6, 3, 1, 1, bias=False), DenseBlock(3, 6, 5), Transition(21, 10),
                          DenseBlock(2, 10, 3), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
    return model, (torch.randn(2, 3, 15, 11),)


# ---- torchvision SqueezeNet fire module --------------------------------------------------------
class Fire(nn.Module):
    def __init__(self, cin, squeeze, expand1x1, expand3x3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)), self.expand3x3_activation(self.expand3x3(x))], 1)


def squeezenet_blocks():
    """SqueezeNet 1.1's layout: ceil-mode max pools between fire modules, a 1x1 classifier conv."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
                          Fire(8, 3, 5, 6), Fire(11, 3, 5, 6), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(11, 4, 7, 7),
                          nn.Dropout(0.5), nn.Conv2d(14, 5, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)),
                          nn.Flatten())
    return model, (torch.randn(2, 3, 35, 29),)


# ---- torchvision VGG --------------------------------------------------------------------------
class VGG(nn.Module):
    """conv-ReLU-max pool features, AdaptiveAvgPool2d((7, 7)), flatten, Linear-ReLU-Dropout x2, Linear."""

    def __init__(self, classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2),
                                      nn.Conv2d(6, 5, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(5 * 7 * 7, 24), nn.ReLU(True), nn.Dropout(0.5),
                                        nn.Linear(24, 24), nn.ReLU(True), nn.Dropout(0.5), nn.Linear(24, classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg_head():
    return VGG(), (torch.randn(2, 3, 22, 18),)


# ---- U-Net with transposed convolutions (milesial/Pytorch-UNet style) ----------------------------
class DoubleConv(nn.Sequential):
    def __init__(self, cin, cout, mid=None):
        mid = mid or cout
        super().__init__(nn.Conv2d(cin, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                         nn.Conv2d(mid, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Up(nn.Module):
    """ConvTranspose2d(k=2, s=2), pad to the skip's size (odd sizes), cat, DoubleConv."""

    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        dy, dx = x2.size(2) - x1.size(2), x2.size(3) - x1.size(3)
        x1 = F.pad(x1, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, cin=3, classes=3, w=6):
        super().__init__()
        self.inc = DoubleConv(cin, w)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(w, 2 * w))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), DoubleConv(2 * w, 4 * w))
        self.up1 = Up(4 * w, 2 * w)
        self.up2 = Up(2 * w, w)
        self.outc = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


def unet_transposed():
    return UNet(), (torch.randn(2, 3, 19, 22),)


# ---- pix2pix / CycleGAN ResNet generator (reflection padding, instance norm, transposed convs) ----
class ResnetBlock(nn.Module):
    """ReflectionPad2d(1)-conv3x3-IN-ReLU-ReflectionPad2d(1)-conv3x3-IN, plus the input."""

    def __init__(self, dim):
        super().__init__()
        self.conv_block = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3), nn.InstanceNorm2d(dim), nn.ReLU(True),
                                        nn.Dropout(0.5), nn.ReflectionPad2d(1), nn.Conv2d(dim, dim, 3),
                                        nn.InstanceNorm2d(dim))

    def forward(self, x):
        return x + self.conv_block(x)


def resnet_generator():
    """ReflectionPad2d(3) + 7x7 stem, two stride-2 downsamplings, resnet blocks (one with
    padding_mode="reflect" / "replicate" convs instead of pad layers), two ConvTranspose2d(3,
    stride 2, padding 1, output_padding 1) upsamplings, a 7x7 conv and tanh."""
    ngf = 4
    model = nn.Sequential(
        nn.ReflectionPad2d(3), nn.Conv2d(3, ngf, 7), nn.InstanceNorm2d(ngf, affine=True), nn.ReLU(True),
        nn.Conv2d(ngf, 2 * ngf, 3, 2, 1), nn.InstanceNorm2d(2 * ngf), nn.ReLU(True),
        nn.Conv2d(2 * ngf, 4 * ngf, 3, 2, 1), nn.InstanceNorm2d(4 * ngf), nn.ReLU(True),
        ResnetBlock(4 * ngf), ResnetBlock(4 * ngf),
        nn.Conv2d(4 * ngf, 4 * ngf, 3, padding=1, padding_mode="reflect"), nn.ReplicationPad2d((1, 0, 2, 1)),
        nn.Conv2d(4 * ngf, 4 * ngf, 3, padding=(1, 0), padding_mode="replicate"), nn.ReLU(True),
        nn.ConvTranspose2d(4 * ngf, 2 * ngf, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(2 * ngf), nn.ReLU(True),
        nn.ConvTranspose2d(2 * ngf, ngf, 3, 2, 1, output_padding=1, bias=False), nn.InstanceNorm2d(ngf), nn.ReLU(True),
        nn.ReflectionPad2d(3), nn.Conv2d(ngf, 3, 7), nn.Tanh())
    return model, (torch.randn(2, 3, 20, 16),)


# ---- FPN (torchvision.ops.FeaturePyramidNetwork style) ---------------------------------------------
class FPN(nn.Module):
    """Backbone of three strided stages; lateral 1x1 convs, a top-down path of nearest x2
    upsampling added to the laterals, 3x3 output convs, and an extra max-pooled level."""

    def __init__(self, widths=(5, 9, 14), out=6):
        super().__init__()
        cins = (3,) + widths[:-1]
        self.body = nn.ModuleList(nn.Sequential(nn.Conv2d(ci, co, 3, 2, 1), nn.ReLU()) for ci, co in zip(cins, widths))
        self.inner = nn.ModuleList(nn.Conv2d(c, out, 1) for c in widths)
        self.layer = nn.ModuleList(nn.Conv2d(out, out, 3, padding=1) for _ in widths)

    def forward(self, x):
        feats = []
        for stage in self.body:
            x = stage(x)
            feats.append(x)
        last = self.inner[-1](feats[-1])
        results = [self.layer[-1](last)]
        for i in range(len(feats) - 2, -1, -1):
            lateral = self.inner[i](feats[i])
            last = lateral + F.interpolate(last, scale_factor=2, mode="nearest")
            results.insert(0, self.layer[i](last))
        results.append(F.max_pool2d(results[-1], 1, 2, 0))
        return tuple(results)


def fpn():
    return FPN(), (torch.randn(2, 3, 32, 24),)


# ---- normalisations: GroupNorm, InstanceNorm2d -------------------------------------------------
class NormBlocks(nn.Module):
    """GN-ReLU conv blocks (the detection-head style), then InstanceNorm2d with and without affine
    (style-transfer nets), one with running statistics (used in eval), a residual add."""

    def __init__(self):
        super().__init__()
        self.gn = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.GroupNorm(3, 6), nn.ReLU(),
                                nn.Conv2d(6, 10, 3, 2, 1), nn.GroupNorm(2, 10), nn.ReLU())
        self.inorm = nn.Sequential(nn.Conv2d(10, 10, 3, padding=1), nn.InstanceNorm2d(10, affine=True), nn.ReLU(),
                                   nn.Conv2d(10, 7, 3, padding=1), nn.InstanceNorm2d(7),
                                   nn.InstanceNorm2d(7, affine=True, track_running_stats=True))
        self.skip = nn.Conv2d(10, 7, 1)

    def forward(self, x):
        x = self.gn(x)
        return self.inorm(x) + self.skip(x)


def norm_blocks():
    return NormBlocks(), (torch.randn(2, 3, 13, 11),)


# ---- activations -------------------------------------------------------------------------------
class Activations(nn.Module):
    """A conv between each of the activations public models use, so every one meets a conv's output."""

    ACTS = (nn.ELU, lambda: nn.PReLU(), lambda: nn.PReLU(5), nn.Mish, lambda: nn.LeakyReLU(0.2), nn.SiLU, nn.Hardswish,
            nn.GELU, lambda: nn.GELU(approximate="tanh"), lambda: nn.ELU(alpha=0.7), nn.SELU, lambda: nn.CELU(0.5),
            nn.Softplus, lambda: nn.Softplus(beta=2.0, threshold=1.0), nn.LogSigmoid)

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 5, 3, padding=1)]
        for act in self.ACTS:
            layers += [act(), nn.Conv2d(5, 5, 3, padding=1)]
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


def activations():
    return Activations(), (torch.randn(2, 3, 9, 7) * 3,)


# ---- pooling variants and padding="same" --------------------------------------------------------
class PoolingAndSame(nn.Module):
    """AvgPool2d(count_include_pad=False), AdaptiveMaxPool2d(1) and to a size that divides the
    input's, padding="same" convs (odd and even kernels, dilated), padding_mode="zeros" written out."""

    def __init__(self):
        super().__init__()
        self.same3 = nn.Conv2d(3, 6, 3, padding="same", padding_mode="zeros")
        self.same4 = nn.Conv2d(6, 5, (4, 2), padding="same")
        self.same_dilated = nn.Conv2d(5, 7, 3, padding="same", dilation=2, bias=False)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.max = nn.AdaptiveMaxPool2d(1)
        self.max_grid = nn.AdaptiveMaxPool2d((3, 5))
        self.fc = nn.Linear(7, 3)

    def forward(self, x):
        x = self.avg(F.relu(self.same_dilated(self.same4(self.same3(x)))))
        return self.fc(torch.flatten(self.max(x), 1)), self.max_grid(x)


def pooling_and_same():
    return PoolingAndSame(), (torch.randn(2, 3, 11, 9),)


# ---- audio-style Conv1d block ------------------------------------------------------------------
class Conv1dBlocks(nn.Module):
    """conv1d + BatchNorm1d + ReLU (strided, dilated, grouped, padding="same" with an even
    kernel, padding_mode="reflect" and "replicate"), InstanceNorm1d, a ConvTranspose1d
    upsampling (vocoder style), MaxPool1d and AvgPool1d (M5 style), global pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(2, 6, 5, stride=2, padding=2), nn.BatchNorm1d(6), nn.ReLU(),
                                  nn.MaxPool1d(3, stride=2, padding=1, ceil_mode=True),
                                  nn.Conv1d(6, 6, 3, padding=2, dilation=2, groups=3), nn.BatchNorm1d(6), nn.ReLU(),
                                  nn.Conv1d(6, 7, 1), nn.BatchNorm1d(7), nn.ReLU(),
                                  nn.Conv1d(7, 7, 4, padding="same"), nn.InstanceNorm1d(7, affine=True), nn.ReLU(),
                                  nn.ConvTranspose1d(7, 6, 4, stride=2, padding=1), nn.LeakyReLU(0.1),
                                  nn.Conv1d(6, 6, 5, padding=2, padding_mode="reflect"), nn.ReflectionPad1d((2, 1)),
                                  nn.Conv1d(6, 5, 3, padding=1, padding_mode="replicate", groups=1), nn.ReLU(),
                                  nn.AvgPool1d(2), nn.MaxPool1d(2))
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        return self.fc(self.body(x).mean(-1))


def conv1d_blocks():
    return Conv1dBlocks(), (torch.randn(2, 2, 75),)


# ---- video: 3-D convs (torchvision's R3D / R(2+1)D, X3D's channelwise convs, a tubelet embedding) ----
class VideoBlocks(nn.Module):
    """A 3x7x7 stem (stride 1x2x2) with BatchNorm3d and a 1x3x3 MaxPool3d, an R(2+1)D block (1x3x3
    spatial then 3x1x1 temporal conv) with a residual, an X3D-style channelwise 3x3x3 conv
    (groups = channels) with padding="same", an AvgPool3d without the padding's count, global
    AdaptiveAvgPool3d and a linear head; beside it, a VideoMAE tubelet embedding (a 2x4x4 conv of
    stride = kernel) flattened to tokens."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(3, 6, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(6),
                                  nn.ReLU(inplace=True), nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1)))
        self.spatial = nn.Sequential(nn.Conv3d(6, 8, (1, 3, 3), padding=(0, 1, 1), bias=False), nn.BatchNorm3d(8),
                                     nn.ReLU())
        self.temporal = nn.Sequential(nn.Conv3d(8, 6, (3, 1, 1), padding=(1, 0, 0), bias=False), nn.BatchNorm3d(6))
        self.channelwise = nn.Sequential(nn.Conv3d(6, 6, 3, padding="same", groups=6), nn.BatchNorm3d(6), nn.SiLU())
        self.pool = nn.AvgPool3d((2, 3, 3), (1, 2, 2), (1, 1, 1), count_include_pad=False)
        self.head = nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(6, classes))
        self.tubelets = nn.Conv3d(3, 8, (2, 4, 4), (2, 4, 4))

    def forward(self, video):
        x = self.stem(video)
        x = torch.relu(x + self.temporal(self.spatial(x)))
        x = self.pool(self.channelwise(x))
        tokens = self.tubelets(video).flatten(2).transpose(1, 2)
        return self.head(x), tokens


def video_blocks():
    return VideoBlocks(), (torch.randn(2, 3, 5, 17, 14),)


MODELS = {
    "video_conv3d": video_blocks,
    "resnet50_bottleneck": resnet50_blocks,
    "resnext_grouped": resnext_blocks,
    "regnety_grouped_se": regnety_blocks,
    "grouped_convs": grouped_convs,
    "mobilenet_v2_inverted_residual": mobilenet_v2_blocks,
    "efficientnet_b0_mbconv": efficientnet_b0_blocks,
    "densenet_dense_block": densenet_blocks,
    "squeezenet_fire": squeezenet_blocks,
    "vgg_head": vgg_head,
    "unet_conv_transpose": unet_transposed,
    "fpn_nearest": fpn,
    "resnet_generator_reflect_pad": resnet_generator,
    "group_and_instance_norm": norm_blocks,
    "activations": activations,
    "pooling_and_same_padding": pooling_and_same,
    "conv1d_audio": conv1d_blocks,
}


def build(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    return randomized(model), inputs


@pytest.mark.parametrize("name", sorted(MODELS))
def test_third_party_cnn_plans_without_fallbacks(name):
    model, inputs = build(name)
    plan = texelflow.plan(model, inputs)
    assert plan.fallbacks == [], f"{name} runs on the CPU: {plan.fallbacks}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_third_party_cnn_matches_eager(name, device):
    model, inputs = build(name)
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [], f"{name} runs on the CPU: {prog.plan.fallbacks}"
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    check = compare(got, want)
    assert check.max_abs <= TOLERANCE * check.max_ref, (
        f"{name}: max |texelflow - eager| = {check.max_abs:.3g} > {TOLERANCE} x {check.max_ref:.3g}")


class AdaptiveMaxUneven(nn.Module):
    """AdaptiveMaxPool2d whose windows overlap (7 -> 3, 8 -> 3), one whose windows tile the input,
    and one whose indices are read."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.uneven = nn.AdaptiveMaxPool2d((3, 3))
        self.tiled = nn.AdaptiveMaxPool2d((7, 4))
        self.with_indices = nn.AdaptiveMaxPool2d(2, return_indices=True)

    def forward(self, x):
        y = self.conv(x)
        values, indices = self.with_indices(y)
        return self.uneven(y), self.tiled(y), values, indices


def test_adaptive_max_pool_runs_on_vulkan_unless_its_indices_are_read(device):
    torch.manual_seed(0)
    model, x = AdaptiveMaxUneven().eval(), torch.randn(2, 3, 7, 8)
    x[0, 1, 2, 3] = float("nan")  # the conv spreads it over a 3 x 3 patch: NaN windows, as torch's
    with texelflow.compile(model, (x,), device=device) as prog:
        reasons = dict(prog.plan.fallbacks)
        kernels = {n.name: n.op.name for n in prog.plan.graph.nodes if n.op is not None}
        got = prog(x)
    assert set(reasons) == {"adaptive_max_pool2d"}, reasons  # (forward calls it first)
    assert "indices are read" in reasons["adaptive_max_pool2d"]
    assert kernels["adaptive_max_pool2d_1"] == "adaptive_max_pool2d_values"
    assert kernels["adaptive_max_pool2d_2"] == "max_pool2d"
    with torch.no_grad():
        want = model(x)
    assert torch.equal(got[3], want[3])  # the indices
    for g, w in zip(got[:3], want[:3]):
        assert torch.equal(g.isnan(), w.isnan())
    check = compare([g.nan_to_num() for g in got[:3]], [w.nan_to_num() for w in want[:3]])
    assert check.max_abs <= TOLERANCE * check.max_ref, check  # (the conv's sums differ in order)


class TextCnn(nn.Module):
    """A text CNN's max over time (`F.adaptive_max_pool1d(x, 1)`), pooling to 3 of 7 positions,
    and a rank-2 input's pooling."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return (F.adaptive_max_pool1d(y, 1).squeeze(-1), F.adaptive_max_pool1d(y, 3),
                F.adaptive_max_pool1d(y[0], 5))


def test_adaptive_max_pool1d_runs_on_vulkan(device):
    torch.manual_seed(0)
    model, x = TextCnn().eval(), torch.randn(2, 4, 7)
    x[1, 2, 4] = float("nan")
    with texelflow.compile(model, (x,), device=device) as prog:
        assert prog.plan.fallbacks == [], prog.plan.fallbacks
        kernels = [n.op.name for n in prog.plan.graph.nodes if n.op is not None]
        got = prog(x)
    assert kernels.count("adaptive_max_pool2d_values") == 3, kernels
    with torch.no_grad():
        want = model(x)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan())
    check = compare([g.nan_to_num() for g in got], [w.nan_to_num() for w in want])
    assert check.max_abs <= TOLERANCE * check.max_ref, check


def test_conv1d_runs_its_own_kernel_where_conv2d_cannot(device, register_tiles):
    """conv1d runs as conv2d over [N, C, L, 1] (fusion); with no texture large enough for conv2d
    it stays a conv1d node, in buffers, still on the device. (register_tiles: on a GPU the first
    would take the im2col form.)"""
    torch.manual_seed(0)
    model = randomized(nn.Sequential(nn.Conv1d(3, 6, 5, stride=2, padding=2), nn.BatchNorm1d(6), nn.ReLU(),
                                     nn.Conv1d(6, 4, 3, dilation=2, groups=2)))
    x = torch.randn(2, 3, 29)
    with torch.no_grad():
        want = model(x)
    for limits, kernel in ((None, "conv2d"), ((1, 1, 1), "conv1d")):
        with texelflow.compile(model, (x,), device=device, texture_limits=limits) as prog:
            assert prog.plan.fallbacks == [], prog.plan.fallbacks
            convs = [n.op.name for n in prog.plan.graph.nodes if n.op is not None and n.op.name.startswith("conv")]
            assert convs == [kernel, kernel], convs
            check = compare(prog(x), want)
        assert check.max_abs <= TOLERANCE * check.max_ref, (limits, check)


def test_video_stem_moves_its_frames_as_whole_vec4_words(device):
    """conv3d by frame slices: the permute to [N, T, C, H, W], the padded frames and their slices
    are each a class, which a 3-channel conv's channels-packed texture pulls toward channels-packed
    buffers, where every slice moves element by element. Planned by transitions alone, the
    classes move together to width-packed buffers (an equally cheap plan, the certificate kept),
    where they move whole vec4 words; the plan's note counts them."""
    stem = nn.Conv3d(3, 6, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False)
    inputs = (torch.randn(1, 3, 4, 16, 16),)
    with texelflow.compile(stem, inputs, device=device) as prog:
        assert prog.plan.fallbacks == [] and prog.plan.optimal
        moves = {d.label: d.spec.get("units_match") for seg in prog.segments if seg.program is not None
                 for d in seg.program.dispatches if d.variant.op in ("slice", "constant_pad_nd")}
        assert len(moves) == 4 and all(moves.values()), moves  # the padding and 3 frame slices
        assert any("moved to their fast path" in note for note in prog.plan.assignment.notes)
        got = prog(*inputs)
    with torch.no_grad():
        want = stem(*inputs)
    check = compare(got, want)
    assert check.max_abs <= TOLERANCE * check.max_ref
