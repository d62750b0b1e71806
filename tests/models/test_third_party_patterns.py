"""More code patterns of public model families, written as their repositories write them (small
sizes, random weights): each plans with no CPU fallback, runs, and matches eager PyTorch within
1e-4 of its largest output.

Detection and segmentation heads (YOLOv5's Focus, SPPF and anchor decode; DeepLab's ASPP), speech
front ends (Whisper's encoder, wav2vec 2.0's feature extractor with a weight-normed positional
conv), token mixers (MLP-Mixer), point clouds (PointNet's input transform), diffusion (a Stable
Diffusion res block with a timestep embedding and cross-attention), a selective scan (Mamba,
unrolled), super-resolution (ESPCN), Swin's relative position bias table, a GCN's normalised
adjacency with a boolean index_put, AlexNet's local response norm, PReLU, a Conformer conv module,
bicubic resizing, unfold / fold, distances, a spatial transformer, and less common activations
and fused arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.models.test_third_party_transformers import runs_whole_and_matches


def randn(*shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Focus(nn.Module):
    """YOLOv5: space-to-depth by strided slices, a conv, SPPF's three chained 5x5 max pools and
    the Detect head's anchor decode on a meshgrid."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(12, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.SiLU())
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.detect = nn.Conv2d(32, 3 * 7, 1)
        self.register_buffer("anchors", torch.tensor([[10.0, 13], [16, 30], [33, 23]]))

    def forward(self, x):
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)
        x = self.conv(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        p = self.detect(torch.cat([x, y1, y2, self.pool(y2)], 1))
        bs, _, ny, nx = p.shape
        p = p.view(bs, 3, 7, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        grid = torch.stack((xv, yv), 2).expand(1, 3, ny, nx, 2).float()
        anchor_grid = self.anchors.view(1, 3, 1, 1, 2).expand(1, 3, ny, nx, 2)
        xy, wh, conf = p.sigmoid().split((2, 2, 3), 4)
        return torch.cat(((xy * 2 - 0.5 + grid) * 8, (wh * 2) ** 2 * anchor_grid, conf), 4).view(bs, -1, 7)


class ASPP(nn.Module):
    """DeepLabV3: dilated 3x3 branches, a pooled branch resized back bilinearly, a projection."""

    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList([nn.Conv2d(8, 4, 1)] + [nn.Conv2d(8, 4, 3, padding=r, dilation=r)
                                                               for r in (2, 3, 5)])
        self.pooled = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 4, 1), nn.ReLU())
        self.project = nn.Conv2d(20, 6, 1)

    def forward(self, x):
        outs = [b(x) for b in self.branches]
        outs.append(F.interpolate(self.pooled(x), size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.project(torch.cat(outs, 1))


class WhisperEncoder(nn.Module):
    """Whisper: two GELU conv1d (the second stride 2), sinusoidal positions, a pre-norm block whose
    q and k are each scaled by d^-1/4, softmax in float."""

    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.conv1, self.conv2 = nn.Conv1d(10, d, 3, padding=1), nn.Conv1d(d, d, 3, stride=2, padding=1)
        inc = torch.exp(-math.log(10000) / 7 * torch.arange(8))
        t = torch.arange(6)[:, None] * inc[None]
        self.register_buffer("positions", torch.cat([t.sin(), t.cos()], 1))
        self.ln, self.ln2, self.ln_post = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = (x + self.positions).to(x.dtype)
        y = self.ln(x)
        n, c, d = y.shape
        scale = (d // self.heads) ** -0.25
        q = self.q(y).view(n, c, self.heads, -1).permute(0, 2, 1, 3) * scale
        k = self.k(y).view(n, c, self.heads, -1).permute(0, 2, 3, 1) * scale
        v = self.v(y).view(n, c, self.heads, -1).permute(0, 2, 1, 3)
        w = (q @ k).float().softmax(-1).to(q.dtype)
        x = x + self.o((w @ v).permute(0, 2, 1, 3).flatten(2))
        return self.ln_post(x + self.mlp(self.ln2(x)))


class Wav2Vec2Features(nn.Module):
    """wav2vec 2.0: a strided conv1d on the waveform, GroupNorm with a group per channel, a
    feature projection, and the weight-normed grouped positional conv whose last frame is cut."""

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv1d(1, 16, 10, 5, bias=False)
        self.norm = nn.GroupNorm(16, 16)
        self.conv1 = nn.Conv1d(16, 16, 3, 2, bias=False)
        self.feature_norm, self.projection = nn.LayerNorm(16), nn.Linear(16, 24)
        self.positional = nn.utils.parametrizations.weight_norm(nn.Conv1d(24, 24, 8, padding=4, groups=4), dim=2)

    def forward(self, wave):
        x = F.gelu(self.conv1(F.gelu(self.norm(self.conv0(wave[:, None])))))
        x = self.projection(self.feature_norm(x.transpose(1, 2)))
        return x + F.gelu(self.positional(x.transpose(1, 2))[:, :, :-1]).transpose(1, 2)


class MixerBlock(nn.Module):
    """MLP-Mixer: an MLP across tokens (between transposes), then one across channels."""

    def __init__(self, tokens: int = 9, channels: int = 8):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 12), nn.GELU(), nn.Linear(12, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(channels, 16), nn.GELU(), nn.Linear(16, channels))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class PointNetInputTransform(nn.Module):
    """PointNet: shared MLPs as 1x1 conv1d with BatchNorm1d, a max over points, a 3x3 transform
    (plus the identity) applied to the points by bmm."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(3, 16, 1), nn.Conv1d(16, 32, 1)
        self.bn1, self.bn2 = nn.BatchNorm1d(16), nn.BatchNorm1d(32)
        self.fc = nn.Linear(32, 9)

    def forward(self, points):
        y = F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(points))))))
        y = torch.max(y, 2, keepdim=True)[0].view(-1, 32)
        transform = (self.fc(y) + torch.eye(3).flatten().view(1, 9).repeat(points.shape[0], 1)).view(-1, 3, 3)
        return torch.bmm(points.transpose(2, 1), transform).transpose(2, 1)


class DiffusionBlock(nn.Module):
    """Stable Diffusion's UNet pieces: a res block with GroupNorm, SiLU and a sinusoidal timestep
    embedding, then a transformer block with cross-attention on a text context and a GEGLU
    feed-forward, then nearest 2x upsampling."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(4, 8, eps=1e-6), nn.GroupNorm(4, 8, eps=1e-6)
        self.conv1, self.conv2 = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.time = nn.Linear(16, 8)
        self.ln = nn.LayerNorm(8)
        self.q, self.k, self.v = nn.Linear(8, 8, bias=False), nn.Linear(12, 8, bias=False), nn.Linear(12, 8, bias=False)
        self.o = nn.Linear(8, 8)
        self.geglu, self.ff_out = nn.Linear(8, 32), nn.Linear(16, 8)

    def forward(self, x, t, context):
        freqs = torch.exp(-math.log(10000) * torch.arange(8, dtype=torch.float32) / 8)
        angles = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(angles), torch.sin(angles)], -1)
        h = self.conv1(F.silu(self.norm1(x))) + self.time(F.silu(emb))[:, :, None, None]
        h = x + self.conv2(F.silu(self.norm2(h)))
        b, c, hh, ww = h.shape
        y = h.permute(0, 2, 3, 1).reshape(b, hh * ww, c)
        z = self.ln(y)
        q = self.q(z).view(b, -1, 2, 4).transpose(1, 2)
        k = self.k(context).view(b, -1, 2, 4).transpose(1, 2)
        v = self.v(context).view(b, -1, 2, 4).transpose(1, 2)
        y = y + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, 8))
        u, gate = self.geglu(y).chunk(2, -1)
        y = y + self.ff_out(u * F.gelu(gate))
        return F.interpolate(y.reshape(b, hh, ww, c).permute(0, 3, 1, 2), scale_factor=2.0, mode="nearest")


class SelectiveScan(nn.Module):
    """Mamba's mixer, the scan unrolled: a causal depthwise conv1d (padded, then cut), softplus
    step sizes, A = -exp(A_log), einsum discretisation and a state recurrence over the tokens."""

    def __init__(self, d: int = 8, inner: int = 16, state: int = 4):
        super().__init__()
        self.inner, self.state = inner, state
        self.in_proj = nn.Linear(d, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
        self.x_proj, self.dt_proj = nn.Linear(inner, 1 + 2 * state), nn.Linear(1, inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, d)

    def forward(self, x):
        b, length, _ = x.shape
        xi, z = self.in_proj(x).chunk(2, -1)
        xi = F.silu(self.conv(xi.transpose(1, 2))[:, :, :length].transpose(1, 2))
        dt, B, C = self.x_proj(xi).split([1, self.state, self.state], -1)
        dt = F.softplus(self.dt_proj(dt))
        dA = torch.exp(torch.einsum("bld,dn->bldn", dt, -torch.exp(self.A_log)))
        dBx = torch.einsum("bld,bln,bld->bldn", dt, B, xi)
        h = torch.zeros(b, self.inner, self.state)
        ys = []
        for i in range(length):
            h = dA[:, i] * h + dBx[:, i]
            ys.append(torch.einsum("bdn,bn->bd", h, C[:, i]))
        return self.out_proj((torch.stack(ys, 1) + xi * self.D) * F.silu(z))


class RelativePositionBias(nn.Module):
    """Swin: a bias table gathered by a constant index of relative positions, added to the scores."""

    def __init__(self, window: int = 3, heads: int = 2):
        super().__init__()
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("index", (rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1]).flatten(), persistent=False)
        self.n = window * window

    def forward(self, scores):
        bias = self.table[self.index].view(self.n, self.n, -1).permute(2, 0, 1).contiguous()
        return (scores + bias.unsqueeze(0)).softmax(-1)


class GCNLayer(nn.Module):
    """Kipf & Welling's GCN: D^-1/2 A D^-1/2 with the infinities of isolated nodes set to 0 by a
    boolean index_put, times a linear of the features."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x, adj):
        d = adj.sum(1).pow(-0.5)
        d[d == float("inf")] = 0
        return (d.unsqueeze(1) * adj * d.unsqueeze(0)) @ self.lin(x)


class ConformerConv(nn.Module):
    """Conformer's conv module: pointwise conv1d, GLU over channels, depthwise conv1d, BatchNorm1d,
    SiLU, pointwise conv1d, residual."""

    def __init__(self, d: int = 12):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.pw1, self.pw2 = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, 1)
        self.dw = nn.Conv1d(d, d, 7, padding=3, groups=d)
        self.bn = nn.BatchNorm1d(d)

    def forward(self, x):
        y = F.glu(self.pw1(self.ln(x).transpose(1, 2)), dim=1)
        return x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)


class SpatialTransformer(nn.Module):
    """A spatial transformer network: an affine theta from a linear, affine_grid, grid_sample."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 6)

    def forward(self, x):
        theta = self.fc(x.flatten(1)).view(-1, 2, 3) * 0.1 + torch.tensor([[1.0, 0, 0], [0, 1, 0]])
        return F.grid_sample(x, F.affine_grid(theta, x.size(), align_corners=False), align_corners=False)


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for name, module in modules.items():
            setattr(self, name, module)

    def forward(self, *args):
        return self.fn(self, *args)


def _adjacency():
    adj = (randn(7, 7).abs() > 0.8).float()
    adj[3], adj[:, 3] = 0, 0  # an isolated node: degree 0, d^-1/2 = inf, set to 0
    return adj


MODELS = {
    "yolov5_focus_sppf_detect": lambda: (Focus(), (randn(1, 3, 14, 10),)),
    "deeplab_aspp": lambda: (ASPP(), (randn(1, 8, 11, 9),)),
    "whisper_encoder": lambda: (WhisperEncoder(), (randn(2, 10, 11),)),
    "wav2vec2_features": lambda: (Wav2Vec2Features(), (randn(2, 203),)),
    "mlp_mixer": lambda: (MixerBlock(), (randn(2, 9, 8),)),
    "pointnet_transform": lambda: (PointNetInputTransform(), (randn(2, 3, 37),)),
    "diffusion_block": lambda: (DiffusionBlock(), (randn(2, 8, 5, 6), torch.tensor([3.0, 500.0]), randn(2, 7, 12, seed=4))),
    "mamba_scan": lambda: (SelectiveScan(), (randn(2, 6, 8),)),
    "espcn": lambda: (nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.Tanh(), nn.Conv2d(16, 9, 3, padding=1),
                                    nn.PixelShuffle(3), nn.Sigmoid()), (randn(1, 1, 7, 5),)),
    "swin_relative_position_bias": lambda: (RelativePositionBias(), (randn(2, 2, 9, 9),)),
    "gcn": lambda: (GCNLayer(), (randn(7, 6), _adjacency())),
    "alexnet_lrn": lambda: (nn.Sequential(nn.Conv2d(3, 12, 5, 2, 2), nn.ReLU(), nn.LocalResponseNorm(5), nn.MaxPool2d(3, 2)),
                            (randn(1, 3, 23, 23),)),
    "prelu": lambda: (nn.Sequential(nn.Conv2d(3, 6, 3), nn.PReLU(6), nn.Conv2d(6, 5, 1), nn.PReLU()), (randn(1, 3, 9, 7),)),
    "conformer_conv": lambda: (ConformerConv(), (randn(2, 9, 12),)),
    "spatial_transformer": lambda: (SpatialTransformer(), (randn(2, 3, 8, 8),)),
    "bicubic_resize": lambda: (Fn(lambda s, x: F.interpolate(x, size=(7, 9), mode="bicubic", align_corners=False)
                                  + F.interpolate(x, size=(7, 9), mode="bicubic", align_corners=True)), (randn(1, 6, 4, 5),)),
    "unfold_fold": lambda: (Fn(lambda s, x: F.fold(F.unfold(x, 3, padding=1, stride=2) * 2, (7, 9), 3, padding=1, stride=2)),
                            (randn(1, 5, 7, 9),)),
    "distances": lambda: (Fn(lambda s, a, b: torch.cdist(a, b) + F.cosine_similarity(a[:, :1], b[:, :1], dim=-1)[..., None]
                             + F.pairwise_distance(a[:, 0], b[:, 0]).view(2, 1, 1)), (randn(2, 5, 7), randn(2, 6, 7, seed=2))),
    "activations": lambda: (Fn(lambda s, x: F.selu(x) + F.celu(x, 0.7) + F.softsign(x) + F.tanhshrink(x)
                               + F.threshold(x, 0.1, -2.0) + F.rrelu(x, training=False) + F.logsigmoid(x)), (randn(2, 5, 7) * 3,)),
    "fused_arithmetic": lambda: (Fn(lambda s, a, b, c: torch.addcmul(a, b, c, value=0.3) + torch.lerp(a, b, c.sigmoid())
                                    + torch.addcdiv(a, b, c.abs() + 1, value=2)
                                    + torch.baddbmm(a, b[:, :, :4], c[:, :4], beta=0.5, alpha=0.125)),
                                 (randn(2, 5, 7), randn(2, 5, 7, seed=2), randn(2, 5, 7, seed=3))),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_pattern_runs_whole_and_matches_eager(name, device):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    runs_whole_and_matches(model, inputs, device)
