"""Template contracts: what a shader template assumes of every op that uses it.

A template opens with a YAML block in a jinja comment:

    {#- contract (read by `make gen`; see docs/ops-yaml.md):
    sync: [[in0, out]]                  tensors that must share packed-dim info
    storage: {weight: buffer}           tensors bound with a fixed storage
    weights: [weight]                   tensors that must be prepacked constants
    checks: [{rank: {input: [4]}}]      node checks (shaders/node_rules.py CHECK_RULES)
    push: {groups: arg, tile: int}      push constants: a derivation, or a type the op must derive
    grid: {per_list_element: tensors}   dispatches: one per output unit (default) or per list item;
                                        {per_row: out}: one invocation per W-row of a tensor;
                                        {cooperative: out, invocations: 8}: 8 invocations of one
                                        workgroup per unit of a tensor (shared-memory reductions);
                                        {per_tile: out, width: 8, height: 4}: one invocation per
                                        8 x 4 tile of each W-H plane of a tensor (tiled products)
    read_outputs: [out]                 outputs the shader also reads (bound read-write)
    -#}

Tensors are named as the op's tensors are, or by position: in0, in1, ... (tensor arguments),
`outputs` (every output).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .checks import Checker
from .diagnostics import Collector, GenError
from .yamlsrc import LMap, loads

CONTRACT_RE = re.compile(r"\A\{#-?\s*contract\b[^\n]*\n(?P<body>.*?)-?#\}", re.S)
CONTRACT_KEYS = ("sync", "storage", "weights", "checks", "push", "grid", "read_outputs")
GRIDS = ("per_output_unit", "per_list_element", "per_row", "cooperative", "per_tile")
# Invocations a cooperative grid may give one unit: powers of two dividing the default workgroup
# size (64, the local_size_x specialization constant), so one unit's invocations share a workgroup.
COOPERATIVE_INVOCATIONS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Contract:
    file: str
    data: LMap  # validated shape; refs are resolved per op by ops_schema

    def line_of(self, key: str) -> int:
        return self.data.line_of(key) if key in self.data else self.data.line


def parse_contract(text: str, file: str, out: Collector) -> Contract:
    """The contract block of a template's source (an empty one when it has none)."""
    m = CONTRACT_RE.match(text)
    if m is None:
        return Contract(file, _empty(1))
    first_line = text[: m.start("body")].count("\n") + 1
    try:
        data = loads(m.group("body"), file, first_line - 1)
    except GenError as exc:  # YAML syntax: diagnostics already carry the template's lines
        out.items.extend(exc.diagnostics)
        data = _empty(first_line)
    c = Checker(file, out)
    c.keys(data, "the template contract", (), CONTRACT_KEYS)
    grid = data.get("grid")
    if grid is not None and grid != "per_output_unit":
        g = c.mapping(grid, data.line_of("grid"), "contract grid")
        if g is not None and not _valid_grid(g):
            c.error(data.line_of("grid"), "contract grid must be per_output_unit, {per_list_element: LIST_ARG}, "
                    "{per_row: TENSOR}, {cooperative: TENSOR, invocations: N} (N in "
                    f"{', '.join(map(str, COOPERATIVE_INVOCATIONS))}) or "
                    "{per_tile: TENSOR, width: W, height: H} (W, H positive)")
    return Contract(file, data)


def _valid_grid(g) -> bool:
    """One of the mapping forms of `grid`."""
    if set(g) == {"cooperative", "invocations"}:
        n = g["invocations"]
        return isinstance(g["cooperative"], str) and isinstance(n, int) and n in COOPERATIVE_INVOCATIONS
    if set(g) == {"per_tile", "width", "height"}:
        sizes = (g["width"], g["height"])
        return isinstance(g["per_tile"], str) and all(isinstance(v, int) and v > 0 for v in sizes)
    return len(g) == 1 and list(g)[0] in GRIDS[1:3] and isinstance(next(iter(g.values())), str)


def _empty(line: int) -> LMap:
    data = LMap()
    data.line, data.key_lines = line, {}
    return data
