"""Transformer blocks written the way public libraries write them run whole on the device.

texelflow never saw these definitions: each is written here from the structure of a public
library's module (torch.nn's MultiheadAttention and TransformerEncoder, torchvision's
VisionTransformer, timm's DeiT, GPT-2, BERT and Swin attention) without importing that library,
at tiny sizes (a few tokens, awkward widths, batch 2). Each must plan with no CPU fallback and
compile to a program that matches eager within 1e-4 of the output's largest value. Token ids are
int32 or torch's default int64 (a user input the device holds as int32, its range checked at the
call).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import texelflow
from texelflow.demo import compare

TOLERANCE = 1e-4  # max |texelflow - eager| over max |eager|


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random non-trivial weights (norms off their identity init), in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 0.8 - 0.4)
    return module.eval()


# ---- torch.nn modules --------------------------------------------------------------------------
class MHA(nn.Module):
    """nn.MultiheadAttention as models call it: self-attention, optional masks."""

    def __init__(self, batch_first: bool, need_weights: bool, embed_dim: int = 12, heads: int = 3):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, heads, dropout=0.1, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x, key_padding_mask=None, attn_mask=None):
        out, weights = self.attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                 need_weights=self.need_weights)
        return (out, weights) if self.need_weights else out


class CrossMHA(nn.Module):
    """nn.MultiheadAttention over a memory of another length (decoder cross-attention)."""

    def __init__(self, embed_dim: int = 12, heads: int = 2):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, heads, batch_first=True)

    def forward(self, x, memory):
        return self.attn(x, memory, memory, need_weights=False)[0]


class Encoder(nn.Module):
    """nn.TransformerEncoder of two nn.TransformerEncoderLayer and a final norm."""

    def __init__(self, norm_first: bool, activation: str, d_model: int = 12, heads: int = 3, layers: int = 2):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=20, dropout=0.1, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)

    def forward(self, x, src_key_padding_mask=None):
        return self.encoder(x, src_key_padding_mask=src_key_padding_mask)


class DefaultEncoder(nn.Module):
    """nn.TransformerEncoder as most code builds it: torch's defaults (nested tensors enabled for a
    padding mask, relu, post-norm) but batch first (and an even head count, as the nested path
    wants), no final norm."""

    def __init__(self, d_model: int = 12, heads: int = 2):
        super().__init__()
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=20,
                                                                        batch_first=True), 2)

    def forward(self, x, src_key_padding_mask=None):
        return self.encoder(x, src_key_padding_mask=src_key_padding_mask)


class CausalLayer(nn.Module):
    """One nn.TransformerEncoderLayer with a causal float mask (generate_square_subsequent_mask)
    and a callable activation."""

    def __init__(self, d_model: int = 12, heads: int = 2):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=20, activation=F.gelu,
                                                batch_first=True, norm_first=True)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.layer(x, src_mask=mask, is_causal=True)


# ---- torchvision's VisionTransformer -----------------------------------------------------------
class TVMLPBlock(nn.Sequential):
    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim), nn.Dropout(0.0))


class TVEncoderBlock(nn.Module):
    def __init__(self, heads: int, dim: int, hidden: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = TVMLPBlock(dim, hidden)

    def forward(self, input):
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x)
        x = x + input
        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class TVEncoder(nn.Module):
    def __init__(self, seq_length: int, layers: int, heads: int, dim: int, hidden: int):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*[TVEncoderBlock(heads, dim, hidden) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, input):
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class TorchvisionViT(nn.Module):
    """torchvision.models.VisionTransformer's structure: conv patchify, class token by expand."""

    def __init__(self, image_size=20, patch_size=5, layers=2, heads=3, dim=12, hidden=20, num_classes=7):
        super().__init__()
        self.image_size, self.patch_size, self.hidden_dim = image_size, patch_size, dim
        self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = TVEncoder(seq_length, layers, heads, dim, hidden)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(dim, num_classes))

    def _process_input(self, x):
        n, c, h, w = x.shape
        p = self.patch_size
        torch._assert(h == self.image_size, "Wrong image height!")
        x = self.conv_proj(x)
        x = x.reshape(n, self.hidden_dim, (h // p) * (w // p))
        return x.permute(0, 2, 1)

    def forward(self, x):
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)
        x = self.encoder(x)
        x = x[:, 0]
        return self.heads(x)


# ---- timm's DeiT (distilled) -------------------------------------------------------------------
class TimmAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class TimmMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)
        self.drop1, self.drop2 = nn.Dropout(0.0), nn.Dropout(0.0)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class TimmBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), TimmAttention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=1e-6), TimmMlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TimmPatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class DistilledViT(nn.Module):
    """timm's VisionTransformerDistilled (DeiT): class and distillation tokens, two heads averaged."""

    def __init__(self, image_size=18, patch=6, dim=15, heads=3, hidden=22, depth=2, num_classes=5):
        super().__init__()
        self.patch_embed = TimmPatchEmbed(patch, dim)
        num_patches = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 2, dim))
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(*[TimmBlock(dim, heads, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        self.head_dist = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), self.dist_token.expand(x.shape[0], -1, -1), x),
                      dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.norm(self.blocks(x))
        x, x_dist = x[:, 0], x[:, 1]
        x, x_dist = self.head(x), self.head_dist(x_dist)
        return (x + x_dist) / 2


# ---- GPT-2 -------------------------------------------------------------------------------------
class Conv1D(nn.Module):
    """GPT-2's linear layer with a transposed weight: addmm(bias, x.view(-1, nx), weight)."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def new_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, dim: int, heads: int, max_positions: int, use_sdpa: bool):
        super().__init__()
        self.n_head, self.split_size, self.use_sdpa = heads, dim, use_sdpa
        self.register_buffer("bias", torch.tril(torch.ones(max_positions, max_positions, dtype=torch.bool))
                             .view(1, 1, max_positions, max_positions), persistent=False)
        self.c_attn = Conv1D(3 * dim, dim)
        self.c_proj = Conv1D(dim, dim)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)

    def _split_heads(self, x):
        new_shape = x.size()[:-1] + (self.n_head, x.size(-1) // self.n_head)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def _attn(self, q, k, v):
        attn = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        T, S = q.size(-2), k.size(-2)
        causal = self.bias[:, :, S - T:S, :S]
        mask_value = torch.finfo(attn.dtype).min
        attn = torch.where(causal, attn, torch.full([], mask_value, dtype=attn.dtype))
        attn = nn.functional.softmax(attn, dim=-1)
        return torch.matmul(self.attn_dropout(attn), v)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(self.split_size, dim=2)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if self.use_sdpa:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        else:
            out = self._attn(q, k, v)
        out = out.permute(0, 2, 1, 3).contiguous()
        out = out.view(out.size()[:-2] + (out.size(-2) * out.size(-1),))
        return self.resid_dropout(self.c_proj(out))


class GPT2MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.c_fc, self.c_proj, self.dropout = Conv1D(hidden, dim), Conv1D(dim, hidden), nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(new_gelu(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, hidden, max_positions, use_sdpa):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(dim, eps=1e-5), GPT2Attention(dim, heads, max_positions, use_sdpa)
        self.ln_2, self.mlp = nn.LayerNorm(dim, eps=1e-5), GPT2MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2LM(nn.Module):
    """GPT-2's LM: token and position embeddings, blocks, final norm, lm head tied to the tokens."""

    def __init__(self, vocab=29, dim=12, heads=3, hidden=20, layers=2, max_positions=9, use_sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_positions, dim)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([GPT2Block(dim, heads, hidden, max_positions, use_sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids):
        position_ids = torch.arange(0, input_ids.size(-1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention: tril buffer, masked_fill with -inf."""

    def __init__(self, dim=12, heads=3, block_size=8):
        super().__init__()
        self.n_head = heads
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = self.attn_dropout(att) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


# ---- BERT --------------------------------------------------------------------------------------
class BertSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, dim // heads
        self.all_head_size = dim
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.1)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(new_context_layer_shape)


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.attention = BertSelfAttention(dim, heads)
        self.attn_dense, self.attn_norm = nn.Linear(dim, dim), nn.LayerNorm(dim, eps=1e-12)
        self.intermediate, self.output = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.out_norm, self.dropout = nn.LayerNorm(dim, eps=1e-12), nn.Dropout(0.1)

    def forward(self, hidden_states, attention_mask):
        attn = self.attention(hidden_states, attention_mask)
        attn = self.attn_norm(self.dropout(self.attn_dense(attn)) + hidden_states)
        inter = F.gelu(self.intermediate(attn))
        return self.out_norm(self.dropout(self.output(inter)) + attn)


class BertModel(nn.Module):
    """BERT's embeddings (word, position, token type), extended additive mask, encoder, pooler."""

    def __init__(self, vocab=31, dim=12, heads=3, hidden=20, layers=2, max_positions=11, type_vocab=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_positions, dim)
        self.token_type_embeddings = nn.Embedding(type_vocab, dim)
        self.emb_norm, self.emb_drop = nn.LayerNorm(dim, eps=1e-12), nn.Dropout(0.1)
        self.register_buffer("position_ids", torch.arange(max_positions).expand((1, -1)), persistent=False)
        self.layer = nn.ModuleList([BertLayer(dim, heads, hidden) for _ in range(layers)])
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask, token_type_ids):
        seq_length = input_ids.size(1)
        position_ids = self.position_ids[:, :seq_length]
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        x = self.emb_drop(self.emb_norm(x))
        extended = attention_mask[:, None, None, :].to(dtype=x.dtype)
        extended = (1.0 - extended) * torch.finfo(x.dtype).min
        for layer in self.layer:
            x = layer(x, extended)
        return x, torch.tanh(self.pooler(x[:, 0]))


# ---- Swin --------------------------------------------------------------------------------------
def window_partition(x, window_size: int):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size: int, H: int, W: int):
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    """Swin's window attention with a relative position bias gathered from a table."""

    def __init__(self, dim: int, window_size: tuple, num_heads: int):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        coords = torch.stack(torch.meshgrid([torch.arange(window_size[0]), torch.arange(window_size[1])],
                                            indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += window_size[0] - 1
        relative_coords[:, :, 1] += window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * window_size[1] - 1
        self.register_buffer("relative_position_index", relative_coords.sum(-1))
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.attn_drop, self.proj, self.proj_drop = nn.Dropout(0.0), nn.Linear(dim, dim), nn.Dropout(0.0)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(
            self.window_size[0] * self.window_size[1], self.window_size[0] * self.window_size[1], -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.attn_drop(self.softmax(attn))
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj_drop(self.proj(x))


class SwinBlock(nn.Module):
    """Swin's SwinTransformerBlock: (shifted) window attention and an MLP, on a B, H*W, C sequence."""

    def __init__(self, dim=6, resolution=(6, 6), num_heads=2, window_size=3, shift_size=1, hidden=10):
        super().__init__()
        self.dim, self.input_resolution = dim, resolution
        self.window_size, self.shift_size = window_size, shift_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, (window_size, window_size), num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = TimmMlp(dim, hidden)
        if shift_size > 0:
            H, W = resolution
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                for w in (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, window_size).view(-1, window_size * window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W = self.input_resolution
        B, L, C = x.shape
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        x_windows = window_partition(x, self.window_size).view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask)
        attn_windows = attn_windows.view(-1, self.window_size, self.window_size, C)
        x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        x = shortcut + x.view(B, H * W, C)
        return x + self.mlp(self.norm2(x))


class SwinStage(nn.Module):
    """Two Swin blocks, the second shifted, as a Swin stage alternates them."""

    def __init__(self, dim=6, resolution=(6, 6), num_heads=2, window_size=3):
        super().__init__()
        self.blocks = nn.Sequential(SwinBlock(dim, resolution, num_heads, window_size, 0),
                                    SwinBlock(dim, resolution, num_heads, window_size, window_size // 2))

    def forward(self, x):
        return self.blocks(x)


# ---- the checks --------------------------------------------------------------------------------
def runs_whole_and_matches(model: nn.Module, inputs: tuple, device, seed: int = 0, keep=None):
    """Plan (no fallback), compile, run, compare with eager within TOLERANCE of its largest value
    (only the elements `keep(output)` selects, when given)."""
    model = seeded(model, seed)
    plan = texelflow.plan(model, inputs)
    assert plan.fallbacks == [], f"runs on the CPU: {plan.fallbacks}"
    with texelflow.compile(model, inputs, device=device) as prog:
        assert prog.plan.fallbacks == []
        got = prog(*inputs)
    with torch.no_grad():
        want = model(*inputs)
    if keep is not None:
        got, want = keep(got), keep(want)
    check = compare(got, want)
    assert check.max_ref > 0 and check.max_abs <= TOLERANCE * check.max_ref, (
        f"max |texelflow - eager| = {check.max_abs:.3g} > {TOLERANCE} x {check.max_ref:.3g}")
    return prog


def tokens(batch: int, length: int, dim: int, seed: int = 1):
    return torch.randn(batch, length, dim, generator=torch.Generator().manual_seed(seed))


def padding_mask(batch: int, length: int):
    """True where a key is padding: the last two keys of the first sequence."""
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[0, -2:] = True
    return mask


CAUSAL_BOOL = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)  # True: not allowed
ADDITIVE = torch.randn(5, 5, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention(batch_first, need_weights, device):
    x = tokens(2, 5, 12) if batch_first else tokens(5, 2, 12)
    runs_whole_and_matches(MHA(batch_first, need_weights), (x,), device)


@pytest.mark.parametrize("batch_first,need_weights,masks", [
    (True, False, "key_padding"),
    (False, True, "key_padding"),
    (True, True, "causal_bool"),
    (False, False, "causal_bool"),
    (True, False, "additive"),
    (False, True, "key_padding+causal_bool"),
])
def test_multihead_attention_with_masks(batch_first, need_weights, masks, device):
    x = tokens(2, 5, 12) if batch_first else tokens(5, 2, 12)
    kpm = padding_mask(2, 5) if "key_padding" in masks else None
    attn_mask = CAUSAL_BOOL if "causal_bool" in masks else ADDITIVE if masks == "additive" else None
    runs_whole_and_matches(MHA(batch_first, need_weights), (x, kpm, attn_mask), device)


def test_multihead_cross_attention(device):
    runs_whole_and_matches(CrossMHA(), (tokens(2, 3, 12), tokens(2, 7, 12, seed=2)), device)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder(norm_first, activation, device):
    runs_whole_and_matches(Encoder(norm_first, activation), (tokens(2, 5, 12),), device)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_with_padding_mask(norm_first, device):
    runs_whole_and_matches(Encoder(norm_first, "gelu"), (tokens(2, 5, 12), padding_mask(2, 5)), device)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # torch's own, from eager
@pytest.mark.parametrize("with_mask", [False, True])
def test_transformer_encoder_with_torch_defaults(with_mask, device):
    """With a padding mask, eager takes torch's nested-tensor path, which returns 0 at padded
    positions, while torch.export traces the plain path, which computes them (its own exported
    program differs from eager there): the padded positions are compared with neither."""
    mask = padding_mask(2, 5)
    inputs = (tokens(2, 5, 12),) + ((mask,) if with_mask else ())
    runs_whole_and_matches(DefaultEncoder(), inputs, device, keep=(lambda out: out[~mask]) if with_mask else None)


def test_transformer_encoder_layer_with_causal_mask(device):
    runs_whole_and_matches(CausalLayer(), (tokens(2, 7, 12),), device)


def test_torchvision_style_vision_transformer(device):
    images = torch.randn(2, 3, 20, 20, generator=torch.Generator().manual_seed(4))
    runs_whole_and_matches(TorchvisionViT(), (images,), device)


def test_deit_with_distillation_token(device):
    images = torch.randn(2, 3, 18, 18, generator=torch.Generator().manual_seed(5))
    runs_whole_and_matches(DistilledViT(), (images,), device)


def token_ids(batch: int, length: int, vocab: int, dtype=torch.int32, seed: int = 6):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["tril_buffer", "sdpa_is_causal"])
def test_gpt2_lm_with_tied_embedding(use_sdpa, device):
    """int32 token ids (see test_gpt2_with_int64_token_ids_runs_whole); the position
    embedding of arange's ids is folded into a constant, the token embedding runs on the device."""
    prog = runs_whole_and_matches(GPT2LM(use_sdpa=use_sdpa), (token_ids(2, 7, 29),), device)
    assert prog.plan.dispatches["embedding"] == 1


def test_nanogpt_masked_fill_causal_attention(device):
    runs_whole_and_matches(NanoGPTAttention(), (tokens(2, 5, 12),), device)


@pytest.mark.parametrize("mask_dtype", [torch.int32, torch.bool, torch.float32])
def test_bert_with_additive_padding_mask(mask_dtype, device):
    """The 0 / 1 padding mask becomes additive through .to(float) (a cast on the device)."""
    ids, types = token_ids(2, 7, 31), token_ids(2, 7, 2, seed=7)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2]).to(mask_dtype)
    runs_whole_and_matches(BertModel(), (ids, mask, types), device)


@pytest.mark.parametrize("batch", [1, 2])
def test_swin_shifted_window_attention(batch, device):
    """The shifted block rolls there and back; both blocks' bias gathers are folded constants."""
    prog = runs_whole_and_matches(SwinStage(), (tokens(batch, 36, 6),), device)
    assert prog.plan.dispatches["roll"] == 2
    assert not any(n.target.startswith("aten.index") for n in prog.plan.graph.nodes)


def test_gpt2_with_int64_token_ids_runs_whole(device):
    """torch's default int64 ids: the device holds them as int32 (the call checks every value
    fits and uploads an int32 copy), so the token embedding runs on the device too."""
    ids = token_ids(2, 7, 29, dtype=torch.int64)
    prog = runs_whole_and_matches(GPT2LM(), (ids,), device)
    assert prog.plan.dispatches["embedding"] == 1


class RunningMeanMixer(nn.Module):
    """A causal token mixer that averages every prefix (x.cumsum(1) / position), the running
    mean some linear-attention and sequence models use instead of softmax attention."""

    def __init__(self, dim: int = 12):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        positions = torch.arange(1, x.shape[1] + 1, dtype=x.dtype).unsqueeze(-1)
        return x + self.proj(self.norm(x).cumsum(dim=1) / positions)


def test_running_mean_mixer_runs_its_cumsum_on_the_device(device):
    prog = runs_whole_and_matches(RunningMeanMixer(), (tokens(2, 7, 12),), device)
    assert prog.plan.dispatches["cumsum"] == 1


class LlamaBlock(nn.Module):
    """A LLaMA-style decoder block as Meta's and HF's code write it: nn.RMSNorm (torch's own,
    aten.rms_norm), rotary position embeddings applied with rotate_half, grouped-query attention
    (repeat_interleave of the key / value heads), causal SDPA, and a SiLU-gated MLP."""

    def __init__(self, dim: int = 24, heads: int = 4, kv_heads: int = 2, length: int = 7):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(dim, eps=1e-5), nn.RMSNorm(dim)
        self.gate, self.up, self.down = nn.Linear(dim, 40, bias=False), nn.Linear(dim, 40, bias=False), nn.Linear(40, dim, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(length).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x):
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = q * self.cos + self.rotate_half(q) * self.sin
        k = k * self.cos + self.rotate_half(k) * self.sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(attn)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def test_llama_block_with_torch_rmsnorm_rotary_and_grouped_query_attention(device):
    prog = runs_whole_and_matches(LlamaBlock(), (tokens(2, 7, 24),), device)
    assert not any(n.target == "aten.rms_norm.default" for n in prog.plan.graph.nodes)  # decomposed


class DetrSinePosition(nn.Module):
    """DETR's PositionEmbeddingSine: cumulative sums of the unmasked pixels (a bool mask summed as
    float32), normalised, divided by 10000 ** (2 (i // 2) / d), sin and cos interleaved."""

    def __init__(self, features: int = 8):
        super().__init__()
        self.features = features

    def forward(self, x, mask):
        not_mask = ~mask
        y = not_mask.cumsum(1, dtype=torch.float32)
        xx = not_mask.cumsum(2, dtype=torch.float32)
        y = y / (y[:, -1:, :] + 1e-6) * 2 * math.pi
        xx = xx / (xx[:, :, -1:] + 1e-6) * 2 * math.pi
        dim_t = torch.arange(self.features, dtype=torch.float32)
        dim_t = 10000 ** (2 * (dim_t // 2) / self.features)
        px, py = xx[:, :, :, None] / dim_t, y[:, :, :, None] / dim_t
        px = torch.stack((px[:, :, :, 0::2].sin(), px[:, :, :, 1::2].cos()), dim=4).flatten(3)
        py = torch.stack((py[:, :, :, 0::2].sin(), py[:, :, :, 1::2].cos()), dim=4).flatten(3)
        return x + torch.cat((py, px), dim=3).permute(0, 3, 1, 2)


def test_detr_sine_position_embedding(device):
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    mask[1, :, 4:] = True  # the second image padded on the right
    x = torch.randn(2, 16, 5, 6, generator=torch.Generator().manual_seed(2))
    prog = runs_whole_and_matches(DetrSinePosition(), (x, mask), device)
    assert prog.plan.dispatches["cumsum"] == 2


class ClipTextEncoder(nn.Module):
    """CLIP's text tower as open_clip writes it: token and learned position embeddings, causal
    pre-norm blocks, a final LayerNorm, the features of each text's end token (the largest id,
    `x[torch.arange(B), text.argmax(-1)]`) projected by a matrix."""

    def __init__(self, vocab: int = 40, width: int = 16, length: int = 7):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.positional_embedding = nn.Parameter(torch.randn(length, width) * 0.1)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=True) for _ in range(2))
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(torch.randn(width, 8) * width ** -0.5)
        self.register_buffer("attn_mask", torch.full((length, length), float("-inf")).triu(1), persistent=False)

    def forward(self, text):
        x = self.token_embedding(text) + self.positional_embedding
        for block in self.blocks:  # (nn.TransformerEncoder inspects the mask's values: no export)
            x = block(x, src_mask=self.attn_mask)
        x = self.ln_final(x)
        return x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_clip_text_encoder_pools_its_end_tokens_on_the_device(dtype, device):
    """The argmax of the (narrowed) ids and the two-tensor index run on the device: one gather."""
    text = token_ids(3, 7, 39, dtype=dtype, seed=8)
    text[:, -1] = 39  # the end token, the largest id, at a different place in each text
    text[1, 4:] = torch.tensor([39, 0, 0], dtype=dtype)
    prog = runs_whole_and_matches(ClipTextEncoder(), (text,), device)
    assert prog.plan.dispatches["index_select"] == 1


class TopTwoMoE(nn.Module):
    """A mixture-of-experts feed-forward as Mixtral routes it: top-2 of the router's logits,
    softmax over the two, every expert run densely and weighted by its gate (zero where not chosen)."""

    def __init__(self, dim: int = 12, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
                                     for _ in range(experts))

    def forward(self, x):
        weights, chosen = self.router(x).topk(2, dim=-1)
        weights = weights.softmax(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            gate = (weights * (chosen == e)).sum(dim=-1, keepdim=True)
            out = out + gate * expert(x)
        return out


def test_top_two_mixture_of_experts_routes_on_the_device(device):
    runs_whole_and_matches(TopTwoMoE(), (tokens(2, 5, 12),), device)


class DLRM(nn.Module):
    """facebookresearch/dlrm's structure: a bottom MLP of the dense features, one nn.EmbeddingBag
    (sum) per sparse feature fed 1-D indices and offsets, the pairwise dot interaction of the
    feature vectors (bmm, the strict lower triangle gathered by index tensors) and a top MLP with
    a sigmoid. Bag sizes vary, one bag is empty."""

    def __init__(self, dense=5, dim=4, tables=(11, 7, 9)):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 8), nn.ReLU(), nn.Linear(8, dim), nn.ReLU())
        self.emb = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        features = len(tables) + 1
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("li", rows, persistent=False)
        self.register_buffer("lj", cols, persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + features * (features - 1) // 2, 6), nn.ReLU(), nn.Linear(6, 1),
                                 nn.Sigmoid())

    def forward(self, dense, indices, offsets):
        x = self.bot(dense)
        ly = [bag(indices[k], offsets[k]) for k, bag in enumerate(self.emb)]
        t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.li, self.lj]], dim=1))


def test_dlrm_with_embedding_bags(device):
    """Offsets are an input (int64, held as int32): the bags' membership is computed on the device."""
    g = torch.Generator().manual_seed(4)
    indices = torch.stack([torch.randint(0, 7, (9,), generator=g) for _ in range(3)])
    offsets = torch.tensor([[0, 2, 5], [0, 4, 4], [0, 1, 8]])  # bag sizes 2/3/4, 4/0/5, 1/7/1
    runs_whole_and_matches(DLRM(), (torch.randn(3, 5, generator=g), indices, offsets), device)


class T5Attention(nn.Module):
    """T5's self-attention as HF writes it: no 1 / sqrt(d) scale, and a relative position bias
    computed in forward from the query and key lengths: position differences from `arange`, bucketed
    (exact below half the buckets, logarithmic above: a float log cast back to int64, clamped with
    torch.min), looked up in an nn.Embedding of buckets x heads. Encoders bucket both directions;
    decoders only the past (`-torch.min(rel, zeros_like(rel))`) and add a causal mask."""

    def __init__(self, dim: int = 16, heads: int = 2, buckets: int = 8, max_distance: int = 12,
                 bidirectional: bool = True):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.buckets, self.max_distance, self.bidirectional = buckets, max_distance, bidirectional
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(buckets, heads)

    def bucket(self, relative_position):
        buckets, ret = self.buckets, 0
        if self.bidirectional:
            buckets //= 2
            ret = (relative_position > 0).to(torch.long) * buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
        max_exact = buckets // 2
        is_small = relative_position < max_exact
        large = max_exact + (torch.log(relative_position.float() / max_exact)
                             / math.log(self.max_distance / max_exact) * (buckets - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, buckets - 1))
        return ret + torch.where(is_small, relative_position, large)

    def forward(self, x):
        b, t, d = x.shape
        context = torch.arange(t, dtype=torch.long)[:, None]
        memory = torch.arange(t, dtype=torch.long)[None, :]
        bias = self.relative_attention_bias(self.bucket(memory - context)).permute(2, 0, 1).unsqueeze(0)
        if not self.bidirectional:
            bias = bias + torch.triu(torch.full((t, t), float("-inf")), 1)
        q, k, v = (p(x).view(b, t, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(3, 2)) + bias
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        return self.o(torch.matmul(attn, v).transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_t5_relative_position_bias_is_one_constant(bidirectional, device):
    """T5 computes its bias from `arange` every call: an int64 chain through a float log and back.
    Folded through the whole chain, the bias is one constant; the bucket math runs nowhere per call."""
    prog = runs_whole_and_matches(T5Attention(bidirectional=bidirectional), (tokens(2, 15, 16),), device)
    assert "embedding" not in prog.plan.dispatches and "log" not in prog.plan.dispatches
    biases = [v for v in prog.plan.graph.constants if tuple(v.shape) == (1, 2, 15, 15)]
    assert len(biases) == 1, [(v.name, v.shape) for v in prog.plan.graph.constants]


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA reference: the rotations as complex64 unit numbers, torch.polar of the angles."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    freqs = torch.outer(torch.arange(end).float(), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


class MetaLlamaAttention(nn.Module):
    """Attention as Meta's LLaMA reference code writes it: queries and keys rotated as complex
    numbers (view_as_complex of pairs, times a slice of the complex64 `freqs_cis` buffer,
    view_as_real, flatten), its own RMSNorm module (x * rsqrt(mean(x^2) + eps) * weight in float),
    repeated key / value heads and a causal mask added to the scores."""

    def __init__(self, dim: int = 24, heads: int = 4, kv_heads: int = 2, max_len: int = 16):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(dim))
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, max_len), persistent=False)

    def rms_norm(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.norm_weight

    @staticmethod
    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    def repeat_kv(self, x):
        b, t, kv_heads, head_dim = x.shape
        rep = self.heads // kv_heads
        return x[:, :, :, None, :].expand(b, t, kv_heads, rep, head_dim).reshape(b, t, kv_heads * rep, head_dim)

    def forward(self, x, start_pos: int = 0):
        b, t, _ = x.shape
        h = self.rms_norm(x)
        xq = self.wq(h).view(b, t, self.heads, self.head_dim)
        xk = self.wk(h).view(b, t, self.kv_heads, self.head_dim)
        xv = self.wv(h).view(b, t, self.kv_heads, self.head_dim)
        xq, xk = self.apply_rotary_emb(xq, xk, self.freqs_cis[start_pos: start_pos + t])
        xk, xv = self.repeat_kv(xk), self.repeat_kv(xv)
        xq, keys, values = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        return x + self.wo(torch.matmul(scores, values).transpose(1, 2).contiguous().view(b, t, -1))


def test_meta_llama_complex_rotary_embedding_runs_as_float_pairs(device):
    """No kernel takes complex data: the complex values are held as their view_as_real float pairs
    (runtime/graph/complex_pairs.py), the freqs_cis buffer a float constant."""
    prog = runs_whole_and_matches(MetaLlamaAttention(), (tokens(2, 7, 24),), device)
    assert not any("complex" in n.target or "view_as_real" in n.target for n in prog.plan.graph.nodes)
    assert all(not v.dtype.startswith("complex") for v in prog.plan.graph.constants)


class ComplexForms(nn.Module):
    """The complex forms held as pairs: products with complex and real tensors and numbers, a
    quotient, conj, abs, angle, real parts, polar of an input, sums and views."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.polar(torch.rand(5, 3) + 0.5, torch.randn(5, 3)))

    def forward(self, x, r):
        z = torch.view_as_complex(x)                              # [2, 5, 3]
        u = z * self.w + z.conj() * r - 0.5 * z + r               # complex, real, number terms
        v = (u / (self.w + 2)).transpose(0, 1).reshape(5, 6)      # a quotient, then views
        p = torch.polar(r.abs() + 0.1, r)                          # complex from real inputs
        s = (v.sum(1, keepdim=True) + p[0].reshape(5, 3).sum(1, keepdim=True)).exp()
        return torch.cat([v.abs(), v.angle(), torch.view_as_real(s).flatten(1), s.real, s.imag], 1)


def test_complex_forms_run_as_float_pairs_and_match_torch(device):
    gen = torch.Generator().manual_seed(4)
    inputs = (torch.randn(2, 5, 3, 2, generator=gen) * 0.3, torch.randn(2, 5, 3, generator=gen) * 0.3)
    runs_whole_and_matches(ComplexForms(), inputs, device)


class ComplexOut(nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x) * 2


def test_a_complex_output_stays_on_the_cpu_with_its_reason():
    """A graph that returns complex data is not rewritten: its complex nodes stay CPU nodes."""
    plan = texelflow.plan(ComplexOut(), (torch.randn(3, 2),))
    assert plan.fallbacks and any("complex" in why or "view_as_complex" in why for _, why in plan.fallbacks)


class FNetLayer(nn.Module):
    """FNet (Google; HF's FNetBasicFourierTransform): tokens mixed by the real part of a 2-D FFT over
    the sequence and hidden dims, then LayerNorm and a GELU feed-forward."""

    def __init__(self, dim: int = 12):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 20), nn.GELU(), nn.Linear(20, dim))

    def forward(self, x):
        x = self.norm1(x + torch.fft.fftn(x, dim=(1, 2)).real)
        return self.norm2(x + self.ff(x))


class GlobalFilter(nn.Module):
    """GFNet's global filter: rfft2 over the spatial dims ("ortho"), a learned complex filter
    (view_as_complex of a parameter), irfft2 back to the spatial size."""

    def __init__(self, h: int = 5, w: int = 6, dim: int = 8):
        super().__init__()
        self.complex_weight = nn.Parameter(torch.randn(h, w // 2 + 1, dim, 2) * 0.02)

    def forward(self, x):
        b, h, w, c = x.shape
        y = torch.fft.rfft2(x, dim=(1, 2), norm="ortho") * torch.view_as_complex(self.complex_weight)
        return x + torch.fft.irfft2(y, s=(h, w), dim=(1, 2), norm="ortho")


def test_fnet_fourier_mixing_runs_as_dft_matmuls(device):
    """No FFT kernel: each transformed dim is a product with the DFT's cos and sin matrices."""
    prog = runs_whole_and_matches(FNetLayer(), (tokens(2, 7, 12),), device)
    assert not any("fft" in n.target for n in prog.plan.graph.nodes)


def test_gfnet_global_filter_with_rfft2_and_irfft2(device):
    x = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(5))
    runs_whole_and_matches(GlobalFilter(), (x,), device)


class FourierForms(nn.Module):
    def forward(self, x):
        z = torch.fft.fft(x, dim=1, norm="forward")
        back = torch.fft.ifft(z, dim=1, norm="forward").real                 # x again
        spectrum = torch.fft.rfft(x, dim=-1).abs()                            # odd length 7: no Nyquist bin
        smooth = torch.fft.irfft(torch.fft.rfft(x, dim=1) * 0.5, n=6, dim=1)   # even length 6
        return torch.cat([back.flatten(1), spectrum.flatten(1), smooth.flatten(1),
                          torch.fft.ifftn(z, norm="ortho").imag.flatten(1)], 1)


def test_fourier_forms_match_torch_in_every_norm(device):
    x = torch.randn(3, 6, 7, generator=torch.Generator().manual_seed(6))
    runs_whole_and_matches(FourierForms(), (x,), device)


class VideoSwinMlp(nn.Module):
    """Video Swin's token MLP on channels-last video tokens [B, D, H, W, C] (rank 5): LayerNorm,
    Linear, GELU, Linear, a residual; then a per-(frame, channel) gate from a second input that
    broadcasts inside the leading dims."""

    def __init__(self, dim: int = 12):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x, gate):
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return x * torch.sigmoid(gate)


def test_video_swin_mlp_on_rank5_tokens_keeps_its_prepacked_linears(device):
    """The leading dims of a rank-5 input merged for the row-wise ops (lowering's _rows_of_rank3):
    LayerNorm on the device, not the CPU, and the linears prepacked, not torch's addmm."""
    gen = torch.Generator().manual_seed(7)
    x, gate = torch.randn(2, 3, 5, 6, 12, generator=gen), torch.randn(1, 3, 1, 1, 12, generator=gen)
    prog = runs_whole_and_matches(VideoSwinMlp(), (x, gate), device)
    assert prog.plan.dispatches["linear_packed"] == 2 and prog.plan.dispatches["layer_norm"] == 1
    assert "addmm" not in prog.plan.dispatches


class FourierLengths(nn.Module):
    """Transform lengths other than the input's (n= and s=): torch trims a longer input and pads a
    shorter one with zeros, along each transformed dim."""

    def forward(self, x):
        return torch.cat([
            torch.fft.fft(x, n=9).real.flatten(1),                               # padded
            torch.view_as_real(torch.fft.fft(x, n=3, norm="ortho")).flatten(1),  # trimmed
            torch.fft.irfft(torch.fft.rfft(x), n=12).flatten(1),                 # irfft padded
            torch.fft.irfft(torch.fft.rfft(x), n=4).flatten(1),                  # irfft trimmed
            torch.fft.irfft2(torch.fft.rfft2(x, s=(4, 6)), s=(3, 7)).flatten(1),
        ], 1)


def test_fourier_lengths_pad_and_trim_as_torch(device):
    x = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(8))
    runs_whole_and_matches(FourierLengths(), (x,), device)


class LogMel(nn.Module):
    """An audio front end inside forward, as torchaudio's MelSpectrogram computes it: torch.stft
    (centred by a reflect pad, a Hann window) to a power spectrum, a mel filter bank, a log."""

    def __init__(self, n_fft: int = 32, hop: int = 8, mels: int = 6):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("fbank", torch.rand(n_fft // 2 + 1, mels, generator=torch.Generator().manual_seed(9)))

    def forward(self, wave):
        spec = torch.stft(wave, self.n_fft, self.hop, window=self.window, return_complex=True).abs() ** 2
        return torch.log(spec.transpose(1, 2) @ self.fbank + 1e-6)


class StftForms(nn.Module):
    """stft's other arguments: no centring with a window shorter than n_fft (zero-padded to it),
    no window, normalized, two-sided, constant centring, a 1-D signal, return_complex=False."""

    def forward(self, x):
        return torch.cat([
            torch.stft(x, 16, 5, window=torch.hamming_window(12), win_length=12, center=False,
                       return_complex=True).abs().flatten(1),
            torch.view_as_real(torch.stft(x, 20, window=torch.ones(20), normalized=True, return_complex=True)).flatten(1),
            torch.view_as_real(torch.stft(x, 8, 4, window=torch.ones(8), onesided=False, return_complex=True)).flatten(1),
            torch.stft(x, 16, 4, window=torch.hann_window(16), pad_mode="constant", return_complex=True).real.flatten(1),
            torch.stft(x[0], 16, 6, window=torch.hann_window(16), return_complex=True).abs().flatten()[None].expand(2, -1),
        ], 1)


def test_stft_front_end_runs_as_frames_and_a_dft(device):
    """torch.stft decomposed over the whole program before lowering (frames by unfold, a window,
    rfft as complex_pairs' DFT matrices): no CPU node, torch's answer."""
    x = torch.randn(2, 100, generator=torch.Generator().manual_seed(10))
    prog = runs_whole_and_matches(LogMel(), (x,), device)
    assert not any("stft" in n.target or "fft" in n.target for n in prog.plan.graph.nodes)
    runs_whole_and_matches(StftForms(), (x,), device)
