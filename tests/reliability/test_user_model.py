"""Issue 9, item 6: texelflow never changes the user's model.

plan/compile used to call `.eval()` on the user's module (a side effect, and a GraphModule from
torch.export or torchao's convert_pt2e refuses `.eval()`), and a bare tensor given as
`example_inputs` was split along its first dim. The model is exported in inference mode with
every submodule's training flag restored afterwards; a bare tensor is one input.
"""
from __future__ import annotations

import torch

import texelflow


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.ReLU())


def test_plan_keeps_training_flags():
    model = _model().train()
    model[2].eval()  # a mix of flags, each must come back as it was
    before = [m.training for m in model.modules()]
    texelflow.plan(model, (torch.randn(2, 3),))
    assert [m.training for m in model.modules()] == before == [True, True, True, False]


def test_compile_keeps_training_flags_and_exports_inference(device):
    model = _model().train()
    x = torch.randn(2, 3)
    prog = texelflow.compile(model, (x,), device=device)
    try:
        assert all(m.training for m in model.modules())
        with torch.no_grad():
            want = model.eval()(x)  # inference semantics: dropout is the identity
        torch.testing.assert_close(prog(x), want)
    finally:
        prog.close()


def test_exported_graph_module_that_refuses_eval(device):
    x = torch.randn(2, 3)
    gm = torch.export.export(_model().eval(), (x,)).module()
    try:
        gm.eval()
        refuses = False
    except NotImplementedError:
        refuses = True
    assert refuses  # torch 2.13 refuses, as torchao's convert_pt2e output does
    prog = texelflow.compile(gm, (x,), device=device)
    try:
        torch.testing.assert_close(prog(x), gm(x))
        assert gm.training is True
    finally:
        prog.close()


def test_bare_tensor_is_one_input(device):
    model = torch.nn.Linear(3, 4)
    x = torch.randn(2, 3)
    plan = texelflow.plan(model, x)
    assert [v.shape for v in plan.graph.inputs] == [(2, 3)]
    prog = texelflow.compile(model, x, device=device)
    try:
        with torch.no_grad():
            torch.testing.assert_close(prog(x), model(x))
    finally:
        prog.close()
