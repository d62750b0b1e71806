"""Built-in models for the demo, the CLI, the tests and the benchmarks (no downloads, no weights).

Two tiny ones lavapipe runs in milliseconds (a residual CNN, an MLP-mixer style token model) and
a zoo of the model families texelflow targets, each written the way the public reference
implementations (timm, torchvision) write it, so third-party models built from the same blocks
lower the same way. Weights are random with a fixed seed and drawn so that no branch is constant
(batch-norm statistics and affine terms, layer-scale gammas): a kernel that ignored one of them
would change the output. Every factory returns (model, example_inputs) in eval mode, the form
`texelflow plan MODULE:ATTR` accepts; `ZOO` maps a name to its factory.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- tiny models (tests and docs use these) -----------------------------------------------------
class TinyResNet(nn.Module):
    """conv stem, two residual blocks, pooling, a linear head."""

    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 3, padding=1)])
            for _ in range(2)
        )
        self.head = nn.Linear(channels * 8 * 8, classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for conv1, conv2 in self.blocks:
            x = torch.relu(conv2(torch.relu(conv1(x))) + x)
        x = F.max_pool2d(x, 2)
        x = F.avg_pool2d(x, 1)
        return self.head(x.reshape(x.shape[0], -1))


class TinyMixer(nn.Module):
    """Patch embedding by convolution, token blocks (layer norm, MLP, residual), a linear head."""

    def __init__(self, dim: int = 16, patch: int = 4, blocks: int = 2, classes: int = 10):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.up = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(blocks))
        self.down = nn.ModuleList(nn.Linear(2 * dim, dim) for _ in range(blocks))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        t = self.embed(x)  # [1, dim, h, w]
        t = t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])  # tokens [h*w, dim]
        for norm, up, down in zip(self.norms, self.up, self.down):
            t = t + down(F.gelu(up(norm(t))))
        return self.head(t.mean(0, keepdim=True))


def tiny_resnet():
    torch.manual_seed(0)
    return TinyResNet().eval(), (torch.randn(1, 3, 16, 16),)


def tiny_mixer():
    torch.manual_seed(0)
    return TinyMixer().eval(), (torch.randn(1, 3, 16, 16),)


# ---- weights: random, but never a constant branch -------------------------------------------------
def randomize_norms(model: nn.Module) -> nn.Module:
    """Give every normalisation layer random affine terms and statistics (PyTorch's defaults,
    weight 1 / bias 0 / mean 0 / var 1, would let a kernel that skips them pass)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
                if m.weight is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


# ---- ViT (timm VisionTransformer style) ---------------------------------------------------------
class PatchEmbed(nn.Module):
    """Image to patch tokens: a strided convolution, then NCHW -> NLC."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.Identity()

    def forward(self, x):
        x = self.proj(x)
        x = x.flatten(2).transpose(1, 2)
        return self.norm(x)


class Attention(nn.Module):
    """Multi-head self-attention: one qkv projection, F.scaled_dot_product_attention, a projection."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class Mlp(nn.Module):
    """fc1 -> activation -> fc2 (the transformer MLP; ConvNeXt uses it on channels-last tokens)."""

    def __init__(self, in_features: int, hidden_features: int, act_layer=nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.drop1 = nn.Dropout(0.0)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Patch embedding, class token, position embedding, blocks, final norm, class-token head."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, embed_dim: int = 384, depth: int = 12,
                 num_heads: int = 6, num_classes: int = 1000):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, 3, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, self.patch_embed.num_patches + 1, embed_dim) * 0.5)
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.blocks(x)
        return self.norm(x)

    def forward(self, x):
        x = self.forward_features(x)
        return self.head(x[:, 0])


def vit_s16(image_size: int = 224, batch: int = 1):
    """ViT-S/16: 12 blocks of dim 384 with 6 heads, 1000 classes, at 224x224."""
    torch.manual_seed(0)
    model = randomize_norms(VisionTransformer(image_size, 16, 384, 12, 6, 1000)).eval()
    return model, (torch.randn(batch, 3, image_size, image_size),)


def vit_tiny(image_size: int = 32, batch: int = 1):
    """The ViT-S/16 classes at toy size: 32x32 input, patch 8, dim 64, 2 blocks of 2 heads."""
    torch.manual_seed(0)
    model = randomize_norms(VisionTransformer(image_size, 8, 64, 2, 2, 10)).eval()
    return model, (torch.randn(batch, 3, image_size, image_size),)


# ---- ResNet-18 (torchvision style) -------------------------------------------------------------
def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 conv + batch norm, ReLU between, identity (or 1x1 conv + BN) shortcut, ReLU."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """7x7/2 stem + BN + ReLU + 3x3/2 max pool, four stages of BasicBlocks, global pool, fc."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def resnet18(image_size: int = 224, batch: int = 1):
    """ResNet-18 at 224x224, 1000 classes."""
    torch.manual_seed(0)
    model = randomize_norms(ResNet((2, 2, 2, 2))).eval()
    return model, (torch.randn(batch, 3, image_size, image_size),)


# ---- MobileNetV3-small (torchvision style) -----------------------------------------------------
def make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of `divisor`, never more than 10% below `v`."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvNormActivation(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> activation (none when `activation` is None)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, activation=nn.ReLU):
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
        if activation is not None:
            layers.append(activation())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """Channel gates: global average pool, 1x1 conv, ReLU, 1x1 conv, hard sigmoid, scale."""

    def __init__(self, channels: int, squeeze_channels: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


class InvertedResidual(nn.Module):
    """Expand 1x1, depthwise kxk, optional squeeze-excitation, project 1x1; residual when the
    stride is 1 and the channels stay."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, use_se: bool, activation, stride: int):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormActivation(cin, expanded, 1, activation=activation))
        layers.append(ConvNormActivation(expanded, expanded, kernel, stride, groups=expanded, activation=activation))
        if use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers.append(ConvNormActivation(expanded, cout, 1, activation=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result += x
        return result


# (input channels, kernel, expanded channels, output channels, squeeze-excitation, activation, stride)
MOBILENET_V3_SMALL = [
    (16, 3, 16, 16, True, "RE", 2),
    (16, 3, 72, 24, False, "RE", 2),
    (24, 3, 88, 24, False, "RE", 1),
    (24, 5, 96, 40, True, "HS", 2),
    (40, 5, 240, 40, True, "HS", 1),
    (40, 5, 240, 40, True, "HS", 1),
    (40, 5, 120, 48, True, "HS", 1),
    (48, 5, 144, 48, True, "HS", 1),
    (48, 5, 288, 96, True, "HS", 2),
    (96, 5, 576, 96, True, "HS", 1),
    (96, 5, 576, 96, True, "HS", 1),
]


class MobileNetV3(nn.Module):
    """Hardswish stem, inverted residual blocks, last 1x1 conv, global pool, two-layer classifier."""

    def __init__(self, setting=MOBILENET_V3_SMALL, last_channel: int = 1024, num_classes: int = 1000):
        super().__init__()
        acts = {"RE": nn.ReLU, "HS": nn.Hardswish}
        layers: list[nn.Module] = [ConvNormActivation(3, setting[0][0], 3, stride=2, activation=nn.Hardswish)]
        layers += [InvertedResidual(cin, k, exp, cout, se, acts[act], s) for cin, k, exp, cout, se, act, s in setting]
        last_in = setting[-1][3]
        layers.append(ConvNormActivation(last_in, 6 * last_in, 1, activation=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * last_in, last_channel), nn.Hardswish(),
                                        nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        x = torch.flatten(x, 1)
        return self.classifier(x)


def mobilenet_v3_small(image_size: int = 224, batch: int = 1):
    """MobileNetV3-small at 224x224, 1000 classes."""
    torch.manual_seed(0)
    model = randomize_norms(MobileNetV3()).eval()
    return model, (torch.randn(batch, 3, image_size, image_size),)


# ---- ConvNeXt (timm style) ---------------------------------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    """Layer norm over the channels of an NCHW tensor: permute, F.layer_norm, permute back."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7 conv, then on channels-last tokens: LayerNorm, MLP (4x, GELU), layer scale;
    back to NCHW and a residual."""

    def __init__(self, dim: int, ls_init_value: float = 0.5):
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)
        # timm initialises gamma to 1e-6; around 0.5 here so the branch matters in the output
        self.gamma = nn.Parameter(ls_init_value + 0.25 * torch.rand(dim) - 0.125)

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x)
        x = x.permute(0, 2, 3, 1)
        x = self.norm(x)
        x = self.mlp(x)
        x = x.mul(self.gamma)
        x = x.permute(0, 3, 1, 2)
        return x + shortcut


class ConvNeXtStage(nn.Module):
    """Optional downsample (LayerNorm2d + 2x2/2 conv), then blocks."""

    def __init__(self, cin: int, cout: int, depth: int):
        super().__init__()
        self.downsample = (nn.Sequential(LayerNorm2d(cin, eps=1e-6), nn.Conv2d(cin, cout, 2, stride=2))
                           if cin != cout else nn.Identity())
        self.blocks = nn.Sequential(*[ConvNeXtBlock(cout) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(self.downsample(x))


class ConvNeXt(nn.Module):
    """4x4/4 patchify stem + LayerNorm2d, four stages, global mean, LayerNorm, linear head."""

    def __init__(self, dims=(40, 80, 160, 320), depths=(2, 2, 6, 2), num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], kernel_size=4, stride=4), LayerNorm2d(dims[0], eps=1e-6))
        cins = (dims[0],) + tuple(dims[:-1])
        self.stages = nn.Sequential(*[ConvNeXtStage(ci, co, d) for ci, co, d in zip(cins, dims, depths)])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(self.norm(x.mean([-2, -1])))


def convnext_atto(image_size: int = 224, batch: int = 1):
    """ConvNeXt-atto: dims 40/80/160/320, depths 2/2/6/2, at 224x224."""
    torch.manual_seed(0)
    model = randomize_norms(ConvNeXt()).eval()
    return model, (torch.randn(batch, 3, image_size, image_size),)


# ---- U-Net / RefineNet style decoder ----------------------------------------------------------
class ConvReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3):
        super().__init__(nn.Conv2d(cin, cout, kernel, padding=kernel // 2), nn.ReLU(inplace=True))


class UNetDecoder(nn.Module):
    """Encoder of conv + max pool; a decoder that upsamples by pixel shuffle and by bilinear
    interpolation, joins the encoder's features with torch.cat, refines a coarse prediction
    upsampled to full size (RefineNet style), and ends in a 1x1 conv."""

    def __init__(self, in_chans: int = 3, widths=(12, 24, 48, 96), classes: int = 5):
        super().__init__()
        w1, w2, w3, w4 = widths
        self.enc1 = nn.Sequential(ConvReLU(in_chans, w1), ConvReLU(w1, w1))
        self.enc2 = ConvReLU(w1, w2)
        self.enc3 = ConvReLU(w2, w3)
        self.bottleneck = ConvReLU(w3, w4)
        self.up3 = nn.Conv2d(w4, w3 * 4, 1)  # pixel shuffle by 2: w3 channels at twice the size
        self.dec3 = ConvReLU(2 * w3, w3)
        self.up2 = nn.Conv2d(w3, w2, 1)  # bilinear x2
        self.dec2 = ConvReLU(2 * w2, w2)
        self.up1 = nn.Conv2d(w2, w1 * 4, 1)  # pixel shuffle by 2
        self.dec1 = ConvReLU(2 * w1, w1)
        self.coarse = nn.Conv2d(w4, classes, 1)
        self.final = nn.Conv2d(w1, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        e3 = self.enc3(F.max_pool2d(e2, 2))
        b = self.bottleneck(F.max_pool2d(e3, 2))
        d3 = self.dec3(torch.cat([F.pixel_shuffle(self.up3(b), 2), e3], dim=1))
        up = F.interpolate(self.up2(d3), scale_factor=2, mode="bilinear", align_corners=False)
        d2 = self.dec2(torch.cat([up, e2], dim=1))
        d1 = self.dec1(torch.cat([F.pixel_shuffle(self.up1(d2), 2), e1], dim=1))
        coarse = F.interpolate(self.coarse(b), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.final(d1) + coarse


def unet_decoder(image_size: int = 64, batch: int = 1):
    """The U-Net / RefineNet-style decoder at 64x64, 5 classes per pixel."""
    torch.manual_seed(0)
    return UNetDecoder().eval(), (torch.randn(batch, 3, image_size, image_size),)


ZOO = {
    "vit_s16": vit_s16,
    "vit_tiny": vit_tiny,
    "resnet18": resnet18,
    "mobilenet_v3_small": mobilenet_v3_small,
    "convnext_atto": convnext_atto,
    "unet_decoder": unet_decoder,
}
"""Name -> factory returning (model, example_inputs); factories take `image_size` and `batch`."""

DEFAULT = "texelflow.models:tiny_resnet"
