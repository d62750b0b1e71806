"""Small built-in models for the demo, the CLI and the benchmarks (no downloads, no weights).

They are shaped like the model families texelflow targets, at a size lavapipe runs in
milliseconds: a residual CNN and an MLP-mixer style token model. Each factory returns
(model, example_inputs), the form `texelflow plan MODULE:ATTR` accepts.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    """Patch embedding by convolution, token blocks (layer norm, MLP, residual), a linear head.

    The final token mean has no Vulkan kernel yet: it runs on the CPU and the plan says so.
    """

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


DEFAULT = "texelflow.models:tiny_resnet"
