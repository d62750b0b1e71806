"""Issue 10, item 2: lowering reads torch.export's graph directly.

No `run_decompositions` re-trace when the registry takes every node; a node it lacks is
decomposed alone and spliced only when every piece runs on Vulkan, else it stays one CPU node
with its reason; `plan.fallbacks` lists exactly the CPU nodes; timings per stage; the user's
module is never changed (training flags, the very parameter objects), whatever it is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import texelflow
from texelflow.generated.ops import OPS, TARGETS
from texelflow.runtime.graph import decompose, lowering
from texelflow.runtime.graph.importer import inference_copy
from tests.reliability.models import Call

PLAN_STAGES = {"export", "decomposition", "lowering", "fusion", "permutes", "planning"}


class Block(torch.nn.Module):
    """Every node is a registry target: linear, layer_norm, relu, add."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


class TrainModel(torch.nn.Module):
    """Dropout and batch norm: different in training mode, so export must see inference mode."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(5)
        self.drop = torch.nn.Dropout(0.5)
        self.fc = torch.nn.Linear(5 * 7 * 7, 3)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _spy_run_decompositions(monkeypatch) -> list:
    calls = []
    original = torch.export.ExportedProgram.run_decompositions

    def spy(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", spy)
    return calls


def _hide_from_registry(monkeypatch, *targets: str) -> None:
    """Lower as if the registry lacked `targets` (the lookup lowering makes; nothing else changes)."""
    real = lowering.op_for_target
    monkeypatch.setattr(lowering, "op_for_target", lambda t: None if t in targets else real(t))


def _spy_decompose(monkeypatch) -> list:
    asked = []
    real = decompose.decompose

    def spy(node, target=None):
        asked.append(node.name)
        return real(node, target)

    monkeypatch.setattr(decompose, "decompose", spy)
    return asked


def _cpu_nodes(plan) -> list[str]:
    return [n.name for n in plan.graph.nodes if not n.on_device]


def test_registry_graph_is_lowered_without_run_decompositions(monkeypatch):
    calls = _spy_run_decompositions(monkeypatch)
    asked = _spy_decompose(monkeypatch)
    plan = texelflow.plan(Block().eval(), (torch.randn(2, 3, 6),))
    assert calls == [] and asked == []
    assert plan.fallbacks == []
    targets = {n.target for n in plan.graph.nodes}
    assert "aten.layer_norm.default" in targets  # kept whole, not decomposed; linear too (its kernel:
    assert targets & {"aten.linear.default", "texelflow.linear_packed.default"}  # fusion's choice)


def test_in_place_ops_on_fresh_tensors_need_no_retrace(monkeypatch, device):
    calls = _spy_run_decompositions(monkeypatch)
    # tanh between: a relu right after a linear would fuse into it (fusion step 8)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.ReLU(inplace=True)).eval()
    x = torch.randn(3, 4)
    with texelflow.compile(model, (x,), device=device) as prog:
        assert calls == [] and prog.plan.fallbacks == []
        assert "aten.relu.default" in {n.target for n in prog.plan.graph.nodes}  # relu_ lowered as relu
        torch.testing.assert_close(prog(x), model(x))


def test_a_cpu_node_reads_the_value_before_an_in_place_write(monkeypatch, device):
    _hide_from_registry(monkeypatch, "aten.sigmoid.default")

    def fn(x):
        y = x * 2.0
        z = torch.sigmoid(y)  # on the CPU, reading y before the write below
        y.add_(1.0)
        y.mul_(y)
        return z + y

    x = torch.randn(2, 3, 5)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        assert [name for name, _ in prog.plan.fallbacks] == ["sigmoid"] == _cpu_nodes(prog.plan)
        torch.testing.assert_close(prog(x), fn(x.clone()))


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x):
        self.seen.add_(x.sum(0))  # a buffer written in forward: torch must functionalize
        v = x.view(-1)
        x.relu_()  # an input written in place, seen through a view
        return v * 1.0


def test_other_mutations_are_functionalized_once_by_torch(monkeypatch, device):
    calls = _spy_run_decompositions(monkeypatch)
    model, x = _Counter(), torch.randn(2, 3)
    want_model, want_x = _Counter(), x.clone()
    want = want_model(want_x)
    with texelflow.compile(model, (x.clone(),), device=device) as prog:
        assert len(calls) == 1
        got_x = x.clone()
        torch.testing.assert_close(prog(got_x), want)
        torch.testing.assert_close(got_x, want_x)  # the input written back, as torch does
        torch.testing.assert_close(model.seen, want_model.seen)


def test_only_nodes_the_registry_lacks_are_decomposed_and_spliced(monkeypatch, device):
    _hide_from_registry(monkeypatch, "aten.addcmul.default")
    asked = _spy_decompose(monkeypatch)
    fn = lambda x, y: torch.relu(torch.addcmul(x, x, y, value=0.5))  # noqa: E731
    x, y = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    with texelflow.compile(Call(fn), (x, y), device=device) as prog:
        plan = prog.plan
        assert asked == ["addcmul"]  # relu is a registry target: never asked
        assert plan.fallbacks == []
        pieces = [n for n in plan.graph.nodes if n.name.startswith("addcmul/")]
        assert pieces and all(n.on_device for n in pieces)
        assert "aten.addcmul.default" not in {n.target for n in plan.graph.nodes}
        torch.testing.assert_close(prog(x, y), fn(x, y))


def test_a_decomposition_that_needs_the_cpu_keeps_the_node_whole(monkeypatch, device):
    _hide_from_registry(monkeypatch, "aten.addcmul.default", "aten.mul.Tensor")
    fn = lambda x, y: torch.relu(torch.addcmul(x, x, y, value=0.5)) + 1.0  # noqa: E731
    x, y = torch.randn(3, 7), torch.randn(3, 7)
    with texelflow.compile(Call(fn), (x, y), device=device) as prog:
        plan = prog.plan
        assert _cpu_nodes(plan) == ["addcmul"] == [name for name, _ in plan.fallbacks]
        (reason,) = [why for _, why in plan.fallbacks]
        assert reason.startswith("no Vulkan op implements aten.addcmul.default; its decomposition needs the CPU "
                                 "for aten.mul.Tensor (no Vulkan op implements aten.mul.Tensor)"), reason
        assert not any(n.name.startswith("addcmul/") for n in plan.graph.nodes)  # no half-spliced pieces
        torch.testing.assert_close(prog(x, y), fn(x, y))


def test_a_decomposition_that_makes_a_number_tensor_runs_on_vulkan(monkeypatch, device):
    """lerp's decomposition fills a one-element tensor with its weight (aten.full): a constant, and
    the pieces computed from it alone (abs, ge, where) are folded into constants at lowering."""
    _hide_from_registry(monkeypatch, "aten.lerp.Scalar")
    fn = lambda x, y: torch.lerp(x, y, 0.3)  # noqa: E731
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    with texelflow.compile(Call(fn), (x, y), device=device) as prog:
        assert prog.plan.fallbacks == []
        assert any(v.name.startswith("lerp/") for v in prog.plan.graph.constants)
        ops = {n.op.name for n in prog.plan.graph.nodes if n.op is not None}
        assert not ops & {"full", "abs", "ge"}, ops
        torch.testing.assert_close(prog(x, y), fn(x, y))


def test_fallbacks_are_exactly_the_cpu_nodes(monkeypatch, device):
    _hide_from_registry(monkeypatch, "aten.relu.default", "aten.sigmoid.default")
    fn = lambda x: torch.sigmoid(torch.relu(x * 2.0) + x)  # noqa: E731
    x = torch.randn(2, 5, 3)
    with texelflow.compile(Call(fn), (x,), device=device) as prog:
        plan = prog.plan
        assert [name for name, _ in plan.fallbacks] == _cpu_nodes(plan) == ["relu", "sigmoid"]
        assert all(why.startswith("no Vulkan op implements aten.") for _, why in plan.fallbacks)
        torch.testing.assert_close(prog(x), fn(x))


def test_identity_like_nodes_cost_nothing(device):
    fn = lambda x: F.dropout(x.to(torch.float32).detach(), 0.3, training=False) + 1.0  # noqa: E731
    x = torch.randn(2, 3, 5)
    ep = torch.export.export(Call(fn), (x,))
    kept = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"aten.dropout.default", "aten.to.dtype", "aten.detach.default"} <= kept
    with texelflow.compile(ep, device=device) as prog:
        plan = prog.plan
        assert plan.fallbacks == []
        ident = [n for n in plan.graph.nodes if n.target in ("aten.dropout.default", "aten.to.dtype",
                                                             "aten.detach.default")]
        # folded, or already removed by the permute passes (a view of its input's own shape)
        assert all(n.op.is_identity and n.folded for n in ident)
        assert not any(OPS[op].is_identity for op in plan.dispatches if op in OPS)
        torch.testing.assert_close(prog(x), fn(x))


def test_dropout_in_training_mode_is_not_an_identity():
    fn = lambda x: F.dropout(x, 0.5, training=True)  # noqa: E731
    plan = texelflow.plan(torch.export.export(Call(fn), (torch.randn(4, 4),)))
    assert plan.fallbacks == [("dropout", "dropout with train=True is random: it runs in PyTorch")]
    assert _cpu_nodes(plan) == ["dropout"]


def test_plan_and_compile_report_timings_and_progress(device):
    model, x = Block().eval(), torch.randn(2, 3, 6)
    plan = texelflow.plan(model, (x,))
    assert set(plan.timings) == PLAN_STAGES and all(t >= 0 for t in plan.timings.values())
    assert "timings: export" in plan.timing_summary()
    seen = []
    with texelflow.compile(model, (x,), device=device, progress=lambda *a: seen.append(a)) as prog:
        assert set(prog.timings) == PLAN_STAGES | {"prepacking", "pipelines"}
        assert prog.timings is prog.plan.timings
    stages = [s for s, _, _ in seen]
    assert stages[0] == "prepacking" and stages[-1] == "pipelines" and set(stages) == {"prepacking", "pipelines"}
    for stage in ("prepacking", "pipelines"):
        counts = [(d, t) for s, d, t in seen if s == stage]
        total = counts[0][1]
        assert total > 0 and [d for d, _ in counts] == list(range(total + 1))
        assert all(t == total for _, t in counts)


def _state(model):
    return [m.training for m in model.modules()], [id(t) for t in list(model.parameters()) + list(model.buffers())], \
        {k: v.clone() for k, v in model.state_dict().items()}


def _assert_unchanged(model, before):
    flags, ids, values = before
    after_flags, after_ids, _ = _state(model)
    assert after_flags == flags and after_ids == ids
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, values[k], rtol=0, atol=0)


def test_a_train_mode_module_is_never_changed(monkeypatch, device):
    torch.manual_seed(0)
    model = TrainModel().train()
    model.bn.eval()  # a mix of flags: each must stay as it was
    x = torch.randn(2, 3, 7, 7)
    during = []  # the user's flags while torch.export runs: not even a temporary change
    real_export = torch.export.export

    def export(mod, *args, **kwargs):
        during.append(([m.training for m in model.modules()], mod is model))
        return real_export(mod, *args, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    before = _state(model)
    texelflow.plan(model, (x,))
    with texelflow.compile(model, (x,), device=device) as prog:
        _assert_unchanged(model, before)
        got = prog(x)
    assert during == [(before[0], False)] * 2  # a copy was exported, twice (plan, compile)
    _assert_unchanged(model, before)
    copy = inference_copy(model)
    assert copy is not model and not any(m.training for m in copy.modules())
    assert all(a is b for a, b in zip(copy.parameters(), model.parameters()))  # shared, not copied
    with torch.no_grad():
        torch.testing.assert_close(got, copy(x), rtol=1e-4, atol=1e-4)
    _assert_unchanged(model, before)


def test_export_never_touches_the_users_parameters():
    """torch.export swaps a module's parameters for fake tensors while tracing: the copy's, never
    the user's (a hook copied with the module looks at the user's module during the trace)."""
    model = Block().eval()
    weight = model.fc.weight
    seen = []
    model.register_forward_pre_hook(lambda mod, args: seen.append(model.fc._parameters["weight"] is weight))
    texelflow.plan(model, (torch.randn(2, 3, 6),))
    assert seen and all(seen)
    copy = inference_copy(model)
    assert copy is not model and all(a is b for a, b in zip(copy.parameters(), model.parameters()))


def test_exported_program_and_its_graph_module(device):
    model, x = Block().eval(), torch.randn(2, 3, 6)
    ep = torch.export.export(model, (x,))
    gm = ep.module()
    flags = [m.training for m in gm.modules()]
    for source in (ep, gm):
        with texelflow.compile(source, (x,), device=device) as prog:
            assert prog.plan.fallbacks == []
            torch.testing.assert_close(prog(x), model(x))
    assert [m.training for m in gm.modules()] == flags


def test_vit_like_attention_block_lowers_without_retracing(monkeypatch):
    """What a timm ViT block exports to (reshape, permute, unbind, sdpa, transpose): each node
    is either a registry op or decomposed alone; every CPU node is in plan.fallbacks."""
    calls = _spy_run_decompositions(monkeypatch)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = torch.nn.Linear(12, 36), torch.nn.Linear(12, 12)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
            return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))

    plan = texelflow.plan(Attn().eval(), (torch.randn(2, 5, 12),))
    assert calls == []
    assert [name for name, _ in plan.fallbacks] == _cpu_nodes(plan)
    assert all("/" not in name for name in _cpu_nodes(plan))  # pieces are spliced only when on Vulkan
    assert set(TARGETS) >= {n.target for n in plan.graph.nodes if n.on_device and not n.transition
                            and n.target not in lowering.IDENTITY_RULES}


def test_convert_pt2e_output_compiles_unchanged(device):
    """torchao's convert_pt2e output: a GraphModule in training mode that refuses .eval()."""
    import warnings

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(model, (x,)).module(),
                                XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
        prepared(x)
        quantized = convert_pt2e(prepared)
    before = _state(quantized)
    with texelflow.compile(quantized, (x,), device=device) as prog:
        assert [name for name, _ in prog.plan.fallbacks] == _cpu_nodes(prog.plan)
        assert all(why for _, why in prog.plan.fallbacks)
        torch.testing.assert_close(prog(x), quantized(x))
    _assert_unchanged(quantized, before)
