"""Tiny models the reliability tests compile."""
from __future__ import annotations

import torch


class Call(torch.nn.Module):
    """A module whose forward is `fn(*inputs)`: one op, or a lambda, as a model."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)
