"""Small fx graphs of aten calls built directly, for lowering to splice as a node's pieces.

A decomposition is traced (decompose.py), which breaks composite ops into theirs (a `linear` into
`t` and `mm`); some rewrites need the composite op itself kept, so that lowering still sees it
(a `linear` whose constant weight is prepacked). `Built` records the calls as written, each
node's meta["val"] computed over fake tensors, as a trace would leave it.
"""

from __future__ import annotations


class Built:
    """An fx graph of aten calls on inputs of the given (shape, dtype)s."""

    def __init__(self, specs):
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.torch = torch
        self.mode = FakeTensorMode()
        self.graph = torch.fx.Graph()
        self.inputs = []
        for i, (shape, dtype) in enumerate(specs):
            p = self.graph.placeholder(f"arg{i}")
            with self.mode:
                p.meta["val"] = torch.empty(tuple(shape), dtype=dtype)
            self.inputs.append(p)

    @staticmethod
    def shape(n) -> tuple:
        return tuple(n.meta["val"].shape)

    def call(self, target, *args, **kwargs):
        """A node calling `target`; its fx-node arguments stand for their values."""
        torch = self.torch
        with self.mode:
            vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
            val = target(*vals[0], **vals[1])
        n = self.graph.call_function(target, args, kwargs)
        n.meta["val"] = val
        return n

    def item(self, n, i: int):
        """Output `i` of a node whose op returns several (var_mean's var and mean)."""
        import operator

        m = self.graph.call_function(operator.getitem, (n, i))
        m.meta["val"] = n.meta["val"][i]
        return m

    def module(self, out):
        self.graph.output(out)
        return self.torch.fx.GraphModule(self.torch.nn.Module(), self.graph)
