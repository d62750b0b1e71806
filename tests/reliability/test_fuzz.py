"""Issue 9, acceptance: random small models compile to torch's answer or a clean TexelflowError.

Hypothesis builds a chain of steps from ops the registry implements, ops it does not (CPU
fallbacks) and casts, over random shapes (ranks 0-6, sizes 0, 1 and odd, broadcasting) and
dtypes. Every compiled program must give eager torch's outputs (shape, dtype and values, NaN where
torch has NaN) or raise a TexelflowError; any other exception fails the test.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

import texelflow
from texelflow.runtime.errors import TexelflowError

UNARY = {
    "relu": torch.relu,
    "neg": torch.neg,
    "abs": torch.abs,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": lambda x: torch.exp(x * 0.5),
    "gelu": F.gelu,
    "clamp": lambda x: torch.clamp(x, -1, 1),
    "scale": lambda x: x * 3,
    "add_scalar": lambda x: x + 2,
    "clone": lambda x: x.clone(),
    "flatten": lambda x: x.flatten(),
    "unsqueeze": lambda x: x.unsqueeze(0),
    "squeeze": lambda x: x.squeeze(),
    "permute_rev": lambda x: x.permute(*reversed(range(x.dim()))),
    "transpose": lambda x: x.transpose(0, -1) if x.dim() else x,
    "flip": lambda x: x.flip(-1) if x.dim() else x,
    "cat_self": lambda x: torch.cat([x, x], dim=-1) if x.dim() else x,
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]) if x.dim() else x,
    "sum_last": lambda x: x.sum(-1) if x.dim() else x,
    "mean_all": lambda x: x.float().mean(),
    "to_float": lambda x: x.float(),
    "to_int": lambda x: x.int(),
    "to_double": lambda x: x.double(),
    "sqrt_abs": lambda x: torch.sqrt(torch.abs(x)),
    "erf": torch.erf,
    "leaky_relu": F.leaky_relu,
    "hardswish": F.hardswish,
    "linear": lambda x: F.linear(x, torch.linspace(-1, 1, 3 * x.shape[-1]).reshape(3, -1)) if x.dim() else x,
    "matmul_t": lambda x: x @ x.transpose(-1, -2) if x.dim() >= 2 else x,
    "max_pool": lambda x: F.max_pool2d(x, 2) if x.dim() in (3, 4) and min(x.shape[-2:]) >= 2 else x,
    "avg_pool": lambda x: F.avg_pool2d(x, 1) if x.dim() in (3, 4) else x,
    # not implemented on Vulkan: CPU fallbacks
    "softmax": lambda x: torch.softmax(x, -1) if x.dim() else x,
    "expand": lambda x: x.unsqueeze(0).expand(2, *x.shape),
    # refused: torch.export cannot export it, or texelflow cannot lower it (a clean TexelflowError)
    "branch": lambda x: x * 2 if x.float().sum() > 0 else x,
    "item": lambda x: x * x.float().mean().item() if x.numel() else x,
    "cumsum": lambda x: torch.cumsum(x, dim=-1) if x.dim() else x,
    "sort": lambda x: torch.sort(x, dim=-1).values if x.dim() else x,
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": lambda a, b: torch.pow(torch.abs(a) + 1, b),
}
DTYPES = [torch.float32, torch.float32, torch.int32, torch.int32, torch.float16, torch.int64, torch.bool]


class Random(torch.nn.Module):
    """Steps over a growing list of values: ("u", op, i, _) applies a unary op to value i, ("b", op,
    i, j) a binary op to values i and j, ("c", op, i, _) a binary op to value i and a buffer (a
    constant, or with op "mutate" a buffer forward updates in place)."""

    def __init__(self, steps, buffer):
        super().__init__()
        self.steps = steps
        self.register_buffer("state", buffer)

    def forward(self, x, y):
        values = [x, y]
        for kind, name, i, j in self.steps:
            a = values[i % len(values)]
            if kind == "u":
                values.append(UNARY[name](a))
            elif kind == "c" and name == "mutate":
                self.state.add_(1)
                values.append(a * self.state)
            elif kind == "c":
                values.append(BINARY[name](a, self.state))
            else:
                values.append(BINARY[name](a, values[j % len(values)]))
        return values[-1], values[-2]


@st.composite
def shapes(draw):
    rank = draw(st.integers(0, 6))
    dim = st.sampled_from([1, 1, 2, 3, 5]) if rank > 3 else st.sampled_from([0, 1, 1, 2, 3, 5, 7])
    out = [draw(dim) for _ in range(rank)]
    other_rank = draw(st.integers(0, rank))
    other = [d if draw(st.booleans()) else 1 for d in out[rank - other_rank:]]
    return tuple(out), tuple(other)


steps = st.lists(
    st.one_of(
        st.tuples(st.just("u"), st.sampled_from(sorted(UNARY)), st.integers(0, 9), st.just(0)),
        st.tuples(st.just("b"), st.sampled_from(sorted(BINARY)), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("c"), st.sampled_from(sorted(BINARY) + ["mutate"]), st.integers(0, 9), st.just(0)),
    ),
    min_size=1,
    max_size=5,
)


# mostly one dtype for both inputs (so binary ops reach the device), sometimes two
dtype_pairs = st.sampled_from(DTYPES).flatmap(
    lambda d: st.one_of(st.just((d, d)), st.just((d, d)), st.tuples(st.just(d), st.sampled_from(DTYPES))))


def _tensor(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=gen) * 4 - 2).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randint(-5, 6, shape, generator=gen).to(dtype)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(steps=steps, shape_pair=shapes(), dtypes=dtype_pairs,
       planner=st.sampled_from(["optimal", "greedy"]))
def test_random_models_match_torch_or_refuse_cleanly(device, steps, shape_pair, dtypes, planner):
    buffer = _tensor(shape_pair[1], dtypes[1], 3)
    model, eager = Random(steps, buffer.clone()), Random(steps, buffer.clone())
    inputs = (_tensor(shape_pair[0], dtypes[0], 1), _tensor(shape_pair[1], dtypes[1], 2))
    try:
        with torch.no_grad():
            want = eager(*inputs)
    except (RuntimeError, IndexError, ValueError, TypeError):
        reject()  # torch itself refuses this model
    try:
        prog = texelflow.compile(model, inputs, planner=planner, device=device)
    except TexelflowError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event(f"device nodes: {min(len(prog.plan.graph.device_nodes()), 3)}")
    try:
        try:
            got = prog(*[t.clone() for t in inputs])
        except TexelflowError:
            return
        for g, w in zip(got, want):
            assert g.shape == w.shape, (g.shape, w.shape)
            assert g.dtype == w.dtype, (g.dtype, w.dtype)
            torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4, equal_nan=True)
        torch.testing.assert_close(model.state, eager.state)  # a mutated buffer is written back
    finally:
        prog.close()
