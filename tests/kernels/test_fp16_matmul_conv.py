"""float16 variants of the matmul family and of conv2d, on the device, against torch; and the
subgroup guard of the shuffle kernels (prepack_matmul.shuffle_unfit).

Reference: torch in float32 from the float16-rounded input and weights (what the kernel reads),
the result rounded to float16 (what it stores). Tolerance, per output element:
    |got - want| <= RTOL * |want| + 2**-10 * (|x| * |w|)(element) + 1e-4
RTOL 2e-3: the kernel rounds once at the store and the reference once too; two roundings of
nearly equal float32 sums differ by one float16 ulp (2**-10 relative). The second term scales
with K and with the magnitudes summed (|x| * |w| is the same product on absolute values): it
covers float32 sums in another order (K * 2**-24 relative, far below it) and the prepacked
weights that are not the rounded torch weights (Winograd stores G g G^T rounded to float16,
about half an ulp of each transformed weight); a cancelling sum has a tiny |want| and
needs this term, not the relative one.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import texelflow
from texelflow.runtime.graph.fusion import fuse_patterns
from texelflow.runtime.graph.importer import export_program
from texelflow.runtime.graph.lowering import lower
from texelflow.runtime.graph.plan import plan_graph
from texelflow.runtime.graph.precision import apply_precision
from texelflow.runtime.graph.prepack_matmul import SubgroupFacts, shuffle_unfit, subgroup_facts
from texelflow.runtime.program import CompiledProgram

# these tests name the register-tiled GEMMs and specialised convs: keep them on a GPU too (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("register_tiles")

RTOL = 2e-3
K_TERM = 2.0 ** -10
ATOL = 1e-4
SG4 = SubgroupFacts(size=4, shuffle=True)  # a device whose subgroups are too small for 8-lane groups


class Mm(nn.Module):
    """torch.mm / bmm / matmul / addmm of the inputs, each an op of its own."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _graph(model, inputs, subgroup=None):
    ep = export_program(model, inputs)
    return ep, fuse_patterns(lower(ep), subgroup=subgroup)


def program(model, inputs, device, subgroup=None, nhwc=False):
    """A float16 program with every float16-capable node narrowed, its matmul kernels chosen for
    `subgroup` (the device's own facts when None); `nhwc`: dense convs as conv2d_nhwc."""
    if nhwc:
        plan = texelflow.plan(model, tuple(inputs), device=device, conv_dim_order="nhwc")
        apply_precision(plan, "fp16", device.enabled_features, prune=False)
        return CompiledProgram(plan, plan.exported, device)
    ep, graph = _graph(model, inputs, subgroup if subgroup is not None else subgroup_facts(device.limits))
    plan = plan_graph(graph, "greedy")
    apply_precision(plan, "fp16", device.enabled_features, prune=False)
    return CompiledProgram(plan, ep, device)


def _half(t):
    return t.half().float()


class _GeluInfIsInf(nn.Module):
    """torch's exact GELU with gelu(+Inf) = +Inf, its scalar answer (and the limit): its vectorised
    loop gives NaN there, so which elements get NaN depends on the CPU's vector width and the
    tensor's size (an AVX-512 host with torch 2.11 gave NaN where this machine gives +Inf)."""

    def forward(self, x):
        return torch.where(x == float("inf"), x, nn.functional.gelu(x))


def _rounded_copy(model):
    """`model` with every parameter rounded to float16 (kept float32: torch computes in float32),
    and exact GELUs made independent of the CPU at +Inf (_GeluInfIsInf)."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(_half(p))
    for name, child in list(m.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, nn.GELU) and sub.approximate == "none":
                setattr(child, attr, _GeluInfIsInf())
    if isinstance(m, nn.GELU) and m.approximate == "none":
        return _GeluInfIsInf()
    return m


def _abs_copy(model):
    with torch.no_grad():
        m = _rounded_copy(model)
        for p in m.parameters():
            p.abs_()
    return m


def check(model, inputs, device, op, subgroup=None, specials=False, nhwc=False):
    """Runs `model` as a float16 program whose one device node (beside casts) is `op`, compares
    with the rounded reference (module docstring)."""
    model = model.eval()
    xs = [_half(x) for x in inputs]
    with torch.no_grad():
        want = _half(_rounded_copy(model)(*xs))
        scale = _abs_copy(model)(*[x.abs().nan_to_num(0.0, 0.0, 0.0) for x in xs])
    prog = program(model, inputs, device, subgroup, nhwc)
    try:
        ops = [n.op.name for n in prog.plan.graph.device_nodes() if not n.op.name.startswith("cast_to")]
        assert op in ops, f"expected a {op} node, got {ops}"
        node = next(n for n in prog.plan.graph.nodes if n.op.name == op)
        assert all(v.dtype == "float16" for _, v in node.tensor_args()), "the node was not narrowed"
        got = prog(*inputs)
    finally:
        prog.close()
    assert got.dtype == torch.float32 and got.shape == want.shape
    if specials:
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
        assert torch.equal(got.isinf(), want.isinf())
        assert torch.equal(got[want.isinf()], want[want.isinf()])
    fin = want.isfinite()
    err = (got[fin] - want[fin]).abs()
    bound = RTOL * want[fin].abs() + K_TERM * scale[fin] + ATOL
    worst = (err - bound).max() if err.numel() else torch.tensor(-1.0)
    assert worst <= 0, f"{op}: max error {err.max():.3g} over the bound by {worst:.3g}"


def _specials(x, *where):
    """x with NaN, +Inf and -Inf written at the given indices (in that order, cycling)."""
    x = x.clone()
    for i, idx in enumerate(where):
        x[idx] = (float("nan"), float("inf"), float("-inf"))[i % 3]
    return x


# ---- matmul family ----------------------------------------------------------------------------------
LINEAR = [  # (in, out, input shape, the kernel fusion chooses)
    (13, 5, (3, 13), "linear_packed"),
    (5, 3, (2, 5, 5), "linear_packed"),
    (7, 13, (5, 7), "linear_packed"),
    (1, 7, (3, 1), "linear_packed"),
    (16, 20, (2, 1, 9, 16), "linear_packed"),
    (13, 5, (1, 13), "linear_packed_gemv"),
    (3, 1, (3,), "linear_packed_gemv"),
    (12, 33, (1, 1, 12), "linear_packed_gemv"),
]


def _dims(shape) -> str:
    return "x".join(map(str, shape))


@pytest.mark.parametrize("k,n,shape,op", LINEAR, ids=[f"{op}-{k}x{n}-{_dims(s)}" for k, n, s, op in LINEAR])
def test_linear(device, k, n, shape, op):
    torch.manual_seed(k * 31 + n)
    check(nn.Linear(k, n), [torch.randn(shape)], device, op)


@pytest.mark.parametrize("k,n,shape", [(13, 5, (3, 13)), (5, 3, (2, 5, 5)), (7, 1, (5, 7)), (12, 20, (13, 12))])
def test_linear_general_kernel_when_subgroups_unfit(device, k, n, shape):
    torch.manual_seed(k + n)
    check(nn.Linear(k, n, bias=n != 1), [torch.randn(shape)], device, "linear", subgroup=SG4)


MM = [  # (fn, input shapes, op without / with the subgroup guard)
    (torch.mm, [(5, 13), (13, 3)], "mm"),
    (torch.mm, [(1, 1), (1, 7)], "mm"),
    (torch.mm, [(13, 7), (7, 5)], "mm"),
    (torch.bmm, [(3, 5, 7), (3, 7, 1)], "bmm"),
    (torch.bmm, [(2, 13, 12), (2, 12, 20)], "bmm"),
    (torch.matmul, [(2, 1, 5, 7), (3, 7, 6)], "matmul"),
    (torch.matmul, [(7,), (7, 5)], "matmul"),
    (torch.matmul, [(2, 3, 5), (5,)], "matmul"),
]


@pytest.mark.parametrize("fn,shapes,op", MM, ids=[f"{op}-{'-'.join(_dims(s) for s in sh)}" for _, sh, op in MM])
@pytest.mark.parametrize("guard", [False, True], ids=["fast", "sg4"])
def test_mm_bmm_matmul(device, fn, shapes, op, guard):
    torch.manual_seed(len(shapes[0]) * 7 + shapes[0][-1])
    want_op = "matmul" if guard and op in ("mm", "bmm") else op
    check(Mm(fn), [torch.randn(s) for s in shapes], device, want_op, subgroup=SG4 if guard else None)


class Addmm(nn.Module):
    """addmm(bias, x, weight) with constant bias and weight (addmm's device kernel wants them);
    with alpha = beta = 1 and a bias row it is x @ W + b, which takes the packed linear
    (prepack_matmul._addmm_as_linear), else addmm's own kernel."""

    def __init__(self, k, n, alpha=1.0):
        super().__init__()
        self.b, self.w = nn.Parameter(torch.randn(n)), nn.Parameter(torch.randn(k, n))
        self.alpha = alpha

    def forward(self, x):
        return torch.addmm(self.b, x, self.w, alpha=self.alpha)


@pytest.mark.parametrize("m,k,n,alpha,op", [(3, 7, 5, 1.0, "linear_packed"), (1, 13, 3, 1.0, "linear_packed_gemv"),
                                            (5, 1, 13, 1.0, "linear_packed"), (3, 7, 5, 0.5, "addmm"),
                                            (1, 13, 3, 2.0, "addmm")])
def test_addmm(device, m, k, n, alpha, op):
    torch.manual_seed(m + k + n)
    check(Addmm(k, n, alpha), [torch.randn(m, k)], device, op)


@pytest.mark.parametrize("guard", [False, True], ids=["fast", "sg4"])
def test_matmul_family_nan_inf(device, guard):
    torch.manual_seed(4)
    sub = SG4 if guard else None
    x = _specials(torch.randn(5, 13), (0, 0), (2, 3), (4, 12))
    check(nn.Linear(13, 6), [x], device, "linear" if guard else "linear_packed", sub, specials=True)
    check(nn.Linear(13, 6), [x[1:2]], device, "linear_packed_gemv", sub)  # (row 1: all finite)
    check(nn.Linear(13, 6), [x[:1]], device, "linear_packed_gemv", sub, specials=True)
    check(Mm(torch.mm), [x, torch.randn(13, 7)], device, "matmul" if guard else "mm", sub, specials=True)


# ---- conv2d ---------------------------------------------------------------------------------------------
CONV = [  # (module, input shape, the kernel fusion chooses)
    (lambda: nn.Conv2d(5, 7, 1), (1, 5, 3, 7), "conv2d_pw"),
    (lambda: nn.Sequential(nn.Conv2d(3, 5, 1), nn.ReLU()), (2, 3, 5, 5), "conv2d_pw_act"),
    (lambda: nn.Conv2d(3, 5, 3, padding=1), (1, 3, 5, 7), "conv2d_wino"),
    (lambda: nn.Sequential(nn.Conv2d(7, 3, 3), nn.Hardswish()), (1, 7, 5, 7), "conv2d_wino"),
    (lambda: nn.Conv2d(6, 5, 3, stride=2, padding=1), (1, 6, 13, 13), "conv2d_gemm"),
    (lambda: nn.Conv2d(3, 5, (3, 1), padding=(2, 0), dilation=2), (1, 3, 7, 5), "conv2d_gemm"),
    (lambda: nn.Sequential(nn.Conv2d(5, 13, 5, stride=(1, 2), padding=2), nn.SiLU()), (1, 5, 7, 13), "conv2d_gemm"),
    (lambda: nn.Conv2d(3, 70, 3, stride=2, padding=1), (1, 3, 9, 11), "conv_im2col"),  # then linear_packed
    (lambda: nn.Sequential(nn.Conv2d(8, 66, 3, stride=2), nn.ReLU()), (1, 8, 7, 9), "conv_im2col"),
    (lambda: nn.Conv2d(6, 10, 3, padding=1, groups=2), (1, 6, 5, 7), "conv2d"),
    (lambda: nn.Sequential(nn.Conv2d(9, 6, (2, 3), stride=(2, 1), groups=3), nn.ReLU()), (2, 9, 7, 5), "conv2d_act"),
    (lambda: nn.Conv2d(5, 7, 3, padding=1), (1, 5, 7, 3), "conv2d"),  # tall and narrow: the general kernel
    (lambda: nn.Conv2d(7, 7, 3, stride=2, padding=1, groups=7), (1, 7, 9, 11), "conv2d_dw3_s2"),
    (lambda: nn.Sequential(nn.Conv2d(5, 5, 5, stride=2, padding=2, groups=5), nn.ReLU()), (1, 5, 9, 7), "conv2d_dw5_s2"),
    (lambda: nn.Conv2d(7, 7, 3, stride=(2, 1), padding=1, groups=7), (1, 7, 9, 11), "conv2d_dw"),
    (lambda: nn.Sequential(nn.Conv2d(5, 5, 3, padding=2, dilation=2, groups=5), nn.ReLU6()), (1, 5, 7, 9),
     "conv2d_dw_act"),
    (lambda: nn.Conv2d(5, 5, 3, padding=1, groups=5), (1, 5, 7, 9), "conv2d_dw3_s1"),
    (lambda: nn.Sequential(nn.Conv2d(3, 3, 5, padding=2, groups=3), nn.Hardswish()), (2, 3, 5, 13), "conv2d_dw5_s1"),
    (lambda: nn.Conv2d(1, 1, 3, padding=1), (1, 1, 5, 5), "conv2d_dw3_s1"),
    (lambda: nn.Sequential(nn.Conv2d(6, 6, 7, padding=3, groups=6), nn.GELU()), (1, 6, 7, 5), "conv2d_dw7_s1"),
]


@pytest.mark.parametrize("make,shape,op", CONV, ids=[f"{op}-{i}" for i, (_, _, op) in enumerate(CONV)])
def test_conv2d(device, make, shape, op):
    torch.manual_seed(sum(shape))
    check(make(), [torch.randn(shape) * 3], device, op)


@pytest.mark.parametrize("make,shape,op", CONV, ids=[f"{op}-{i}" for i, (_, _, op) in enumerate(CONV)])
def test_conv2d_nan_inf(device, make, shape, op):
    """NaN, +Inf and -Inf reach exactly the outputs torch gives them to (Winograd: also below)."""
    torch.manual_seed(7)
    n, c, h, w = shape
    x = _specials(torch.randn(shape), (0, 0, 1, 1), (0, c - 1, h - 1, 0), (n - 1, 0, 0, w - 1))
    check(make(), [x], device, op, specials=True)


NHWC = [
    (lambda: nn.Conv2d(5, 7, 3, padding=1), (1, 5, 7, 3)),
    (lambda: nn.Sequential(nn.Conv2d(13, 11, (5, 3), stride=(1, 2), padding=(2, 1), dilation=(1, 2)), nn.ReLU()),
     (1, 13, 9, 9)),
    (lambda: nn.Conv2d(1, 3, 1), (2, 1, 3, 5)),
]


@pytest.mark.parametrize("make,shape", NHWC, ids=[f"nhwc-{i}" for i in range(len(NHWC))])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan-inf"])
def test_conv2d_nhwc(device, make, shape, specials):
    torch.manual_seed(shape[1])
    x = torch.randn(shape) * 3
    if specials:
        n, c, h, w = shape
        x = _specials(x, (0, 0, 1, 1), (0, c - 1, h - 1, 0), (n - 1, 0, 0, w - 1))
    check(make(), [x], device, "conv2d_nhwc", specials=specials, nhwc=True)


@pytest.mark.parametrize("make,shape,where", [
    (lambda: nn.Conv2d(3, 5, 3, padding=1), (1, 3, 6, 8), [(0, 1, 2, 5), (0, 0, 2, 2), (0, 2, 5, 7), (0, 1, 0, 0)]),
    (lambda: nn.Sequential(nn.Conv2d(6, 7, 3), nn.ReLU()), (2, 6, 7, 9), [(1, 5, 3, 3), (0, 0, 6, 8), (1, 2, 0, 4)]),
], ids=["pad1", "nopad-relu"])
def test_conv2d_wino_inf_nan_matches(device, make, shape, where):
    """Winograd's transforms add an input with several signs (an Inf would become Inf - Inf = NaN
    in its tile): the kernel recomputes NaN outputs directly, so NaN, +Inf and -Inf at tile
    corners, inner edges and padded borders reach exactly torch's outputs with torch's signs."""
    torch.manual_seed(5)
    check(make(), [_specials(torch.randn(shape) * 3, *where)], device, "conv2d_wino", specials=True)


# ---- the subgroup guard (planner only: no device) -----------------------------------------------------
def _ops(model, inputs, subgroup):
    return [n.op.name for n in _graph(model, inputs, subgroup)[1].device_nodes()]


@pytest.mark.parametrize("facts,reason", [
    (None, None),
    (SubgroupFacts(8, True), None), (SubgroupFacts(32, True), None), (SubgroupFacts(64, True), None),
    (SubgroupFacts(4, True), "subgroup size 4 is not a multiple of 8"),
    (SubgroupFacts(12, True), "subgroup size 12 is not a multiple of 8"),
    (SubgroupFacts(None, None), "subgroup size unknown is not a multiple of 8"),
    (SubgroupFacts(32, False), "no subgroupShuffle in compute shaders"),
    (SubgroupFacts(32, None), "subgroup operations unknown"),
])
def test_shuffle_unfit(facts, reason):
    assert shuffle_unfit(facts) == reason


def test_guard_keeps_the_general_kernels_and_says_why():
    model = nn.Sequential(nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))  # tanh: no linear + activation fusion
    x = torch.randn(4, 7)
    assert _ops(model, [x], SubgroupFacts(32, True)) == ["linear_packed", "tanh", "linear_packed"]
    graph = _graph(model, [x], SubgroupFacts(32, False))[1]
    nodes = graph.device_nodes()
    assert [n.op.name for n in nodes] == ["linear", "tanh", "linear"]
    assert "linear kernel kept, not linear_packed: no subgroupShuffle in compute shaders" in nodes[0].fused
    assert _ops(model, [x[:1]], SG4) == ["linear_packed_gemv", "tanh", "linear_packed_gemv"]  # no shuffles
    mm = _graph(Mm(torch.bmm), [torch.randn(2, 3, 5), torch.randn(2, 5, 4)], SG4)[1].device_nodes()
    assert [n.op.name for n in mm] == ["matmul"]
    assert "matmul kernel (from bmm): mm_tiled unfit, subgroup size 4 is not a multiple of 8" in mm[0].fused
    assert _ops(Mm(torch.mm), [torch.randn(3, 5), torch.randn(5, 4)], SubgroupFacts(16, True)) == ["mm"]


def test_conv_kernels_but_winograd_runs_ignore_subgroups():
    """Of the conv kernels only conv2d_wino_runs shuffles: with subgroups of 4 a 3x3 conv whose
    output blocks fill runs of 8 takes conv2d_wino, and the others keep their kernels."""
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1, groups=64),
                          nn.Conv2d(64, 4, 1), nn.Conv2d(4, 8, 3, padding=1))
    x = torch.randn(1, 3, 9, 9)
    assert _ops(model, [x], None) == ["conv2d_wino_runs", "conv2d_dw3_s1", "conv2d_pw", "conv2d_wino"]
    assert _ops(model, [x], SG4) == ["conv2d_wino", "conv2d_dw3_s1", "conv2d_pw", "conv2d_wino"]


def test_lavapipe_takes_the_shuffle_kernels(device):
    facts = subgroup_facts(device.limits)
    if "llvmpipe" not in device.limits.name:
        pytest.skip(f"not lavapipe: {device.limits.name}")
    assert facts == SubgroupFacts(8, True, "cpu", device.limits.max_workgroup_invocations, int8_dot=False)
    assert facts.workgroup_invocations >= 256 and shuffle_unfit(facts) is None
    assert _ops(nn.Linear(7, 5), [torch.randn(3, 7)], facts) == ["linear_packed"]
    assert _ops(Mm(torch.mm), [torch.randn(3, 5), torch.randn(5, 4)], facts) == ["mm"]


# ---- rounding at the store ---------------------------------------------------------------------------
def _integer_model(model):
    """`model` with small integer weights and bias: every float32 sum is exact, so the stored
    float16 is torch's rounding of the same number, to the bit."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-20, 21, p.shape, generator=gen).float())
    return model.eval()


EXACT = [  # integer sums into the tens of thousands: float16 keeps every 2nd to 32nd integer there
    (lambda: nn.Linear(13, 5), (3, 13), "linear_packed", None),
    (lambda: nn.Linear(13, 5), (1, 13), "linear_packed_gemv", None),
    (lambda: nn.Linear(13, 5), (3, 13), "linear", SG4),
    (lambda: nn.Conv2d(7, 5, 3, padding=1), (1, 7, 5, 6), "conv2d_wino", None),
    (lambda: nn.Conv2d(7, 5, 1), (1, 7, 5, 6), "conv2d_pw", None),
    (lambda: nn.Conv2d(7, 6, 3, stride=2, padding=1), (1, 7, 7, 9), "conv2d_gemm", None),
    (lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6), (1, 6, 5, 7), "conv2d_dw3_s1", None),
    (lambda: nn.Conv2d(6, 4, 3, padding=1, groups=2), (1, 6, 5, 7), "conv2d", None),
]


@pytest.mark.parametrize("make,shape,op,sub", EXACT, ids=[f"{e[2]}{'-sg4' if e[3] else ''}" for e in EXACT])
def test_stores_round_to_nearest_even(device, make, shape, op, sub):
    torch.manual_seed(12)
    model = _integer_model(make())
    x = torch.randint(-200, 201, shape).float()
    with torch.no_grad():
        want = model(x)
    assert (want.abs() > 2048).any(), "no sum needs rounding: the case tests nothing"
    prog = program(model, [x], device, sub)
    try:
        assert op in [n.op.name for n in prog.plan.graph.device_nodes()]
        got = prog(x)
    finally:
        prog.close()
    assert torch.equal(got, want.half().float())


@pytest.mark.parametrize("fn,shapes", [(torch.mm, [(5, 13), (13, 7)]), (torch.bmm, [(2, 5, 13), (2, 13, 6)]),
                                       (torch.matmul, [(2, 1, 5, 13), (3, 13, 6)])], ids=["mm", "bmm", "matmul"])
@pytest.mark.parametrize("guard", [False, True], ids=["fast", "sg4"])
def test_matmul_stores_round_to_nearest_even(device, fn, shapes, guard):
    torch.manual_seed(13)
    xs = [torch.randint(-200, 201, s).float() for s in shapes]
    want = fn(*xs)
    assert (want.abs() > 2048).any()
    prog = program(Mm(fn), xs, device, SG4 if guard else None)
    try:
        got = prog(*xs)
    finally:
        prog.close()
    assert torch.equal(got, want.half().float())


_ROWS_OUT = [  # ops whose kernels store through _rows.glsl.j2's store4 (linear, matmul templates)
    ("linear-sg4", lambda: nn.Linear(2, 6, bias=False), [(5, 2)], SG4, "linear"),
    ("mm-sg4", lambda: Mm(torch.mm), [(7, 2), (2, 6)], SG4, "matmul"),
    ("matmul", lambda: Mm(torch.matmul), [(2, 1, 5, 2), (3, 2, 5)], None, "matmul"),
]


@pytest.mark.parametrize("name,make,shapes,sub,op", _ROWS_OUT, ids=[r[0] for r in _ROWS_OUT])
def test_rows_texture_stores_round_midpoints_to_even(device, name, make, shapes, sub, op):
    """A float16 texture stored by _rows.glsl.j2's store4 rounds to nearest even like torch (an
    imageStore to rgba16f may truncate): every output is an exact midpoint, an odd integer in
    (2048, 4096) where float16 keeps even integers only, so truncation and ties-away both differ."""
    torch.manual_seed(21)
    model = make().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-1, 2, p.shape).float() * 2 + 1)  # +-1 and +-3
    xs = [torch.randint(-1, 2, s).float() * 2 + 1 for s in shapes]
    # an even float16 integer in [2048, 3848) times 1 plus one odd product: an odd sum, a midpoint
    xs[0][..., 0] = 2048 + 2 * torch.randint(0, 900, xs[0][..., 0].shape).float()
    if op == "linear":
        with torch.no_grad():
            model.weight[:, 0] = 1.0
    else:
        xs[1][..., 0, :] = 1.0
    with torch.no_grad():
        want = model(*xs)
    odd = (want % 2 == 1) & (want.abs() > 2048) & (want.abs() < 4096)
    assert odd.float().mean() > 0.9, "the outputs are not rounding midpoints: the case tests nothing"
    prog = program(model, xs, device, sub)
    try:
        node = next(n for n in prog.plan.graph.device_nodes() if n.op.name == op)
        assert all(v.dtype == "float16" for _, v in node.tensor_args())
        assert "TEXTURE_3D" in str(prog.plan.reprs[name.split("-")[0]]), prog.plan.reprs
        got = prog(*xs)
    finally:
        prog.close()
    assert torch.equal(got, want.half().float())


# ---- the precision pass leaves them float16 --------------------------------------------------------------
class _Net(nn.Module):
    """Every kernel class of this file in one graph: convs (Winograd, depthwise, pointwise, gemm,
    general), a linear, an mm and a bmm of activations."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                   nn.Conv2d(8, 12, 1), nn.Conv2d(12, 8, 3, stride=2, padding=1),
                                   nn.Conv2d(8, 8, 3, padding=1, groups=2))
        self.fc = nn.Linear(8, 6)

    def forward(self, x):
        y = self.convs(x).flatten(2).transpose(1, 2)  # [1, 25, 8]
        y = self.fc(y)  # [1, 25, 6]
        z = torch.bmm(y, y.transpose(1, 2))  # [1, 25, 25]: bmm_nt, B read as it is
        return torch.mm(z[0], y[0])


def test_plan_keeps_matmul_and_conv_nodes_float16_with_no_casts_around_them():
    plan = texelflow.plan(_Net().eval(), (torch.randn(1, 3, 9, 9),), precision="fp16")
    report = plan.precision
    kernels = {"conv2d_wino", "conv2d_dw3_s1", "conv2d_pw", "conv2d_gemm", "conv2d", "linear_packed", "bmm_nt", "mm"}
    nodes = {n.op.name: n for n in plan.graph.device_nodes()}
    assert kernels <= set(nodes), sorted(nodes)
    assert all(v.dtype == "float16" for k in kernels for _, v in [*nodes[k].tensor_args(), *nodes[k].outputs])
    assert report.used == "fp16" and report.num_casts == 1 and not report.single_ops  # the input's cast only
