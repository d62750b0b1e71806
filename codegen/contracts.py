"""Template contracts: what a shader template assumes of every op that uses it.

A template opens with a YAML block in a jinja comment:

    {#- contract (read by `make gen`; see docs/ops-yaml.md):
    sync: [[in0, out]]                  tensors that must share packed-dim info
    storage: {weight: buffer}           tensors bound with a fixed storage
    weights: [weight]                   tensors that must be prepacked constants
    checks: [{rank: {input: [4]}}]      node checks (shaders/node_rules.py CHECK_RULES)
    push: {groups: arg, tile: int}      push constants: a derivation, or a type the op must derive
    grid: {per_list_element: tensors}   dispatches: one per output unit (default) or per list item
                                        (`element_units: NAME`: an element whose spec constant NAME
                                        is nonzero runs over its own units, not all of out's);
                                        {per_row: out}: one invocation per W-row of a tensor;
                                        {cooperative: out, invocations: 8}: 8 invocations of one
                                        workgroup per unit of a tensor (shared-memory reductions);
                                        {per_tile: out, width: 8, height: 4}: one invocation per
                                        8 x 4 tile of each W-H plane of a tensor (tiled products);
                                        (`planes: 1`: of its first plane only, for kernels that
                                        write every plane of a tile themselves);
                                        `invocations: 64` gives each tile 64 invocations of one
                                        workgroup (workgroup-tiled products); 128 or 256 also make
                                        that the variant's workgroup size
    read_outputs: [out]                 outputs the shader also reads (bound read-write)
    spec: {direct: {same_as: [in0, in1], of: out}}
                                        plan-time specialization constants (shape classes): name ->
                                        a rule of shaders/node_rules.py SPEC_RULES; the shader's
                                        default is the rule's general value
    span: {buffer: 16}                  units of `out` per invocation, by out's storage axis
    texel_reads: [query, key]           float inputs that, bound as buffers, are also bound as a
                                        uniform texel buffer (samplerBuffer tb_<name>, one vec4 a
                                        texel) for the spec constant `texel_reads` to read through
                                        (`inputs`: every tensor argument of the op)
    -#}

Tensors are named as the op's tensors are, or by position: in0, in1, ... (tensor arguments),
`outputs` (every output).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from texelflow.shaders.node_rules import SPEC_RULES

from .checks import Checker
from .diagnostics import Collector, GenError, did_you_mean
from .model import SpecDerivation
from .yamlsrc import LMap, loads

CONTRACT_RE = re.compile(r"\A\{#-?\s*contract\b[^\n]*\n(?P<body>.*?)-?#\}", re.S)
CONTRACT_KEYS = ("sync", "storage", "weights", "checks", "push", "grid", "read_outputs", "spec", "span", "texel_reads")
SPEC_NAME_RE = re.compile(r"\A[a-z][a-z0-9_]*\Z")
MAX_SPAN = 64
GRIDS = ("per_output_unit", "per_list_element", "per_row", "cooperative", "per_tile")
# Invocations a cooperative or per_tile grid may give one unit: powers of two dividing the default
# workgroup size (64, the local_size_x specialization constant), so one unit's invocations share a
# workgroup; or, above it, one whole workgroup of that size (WIDE_INVOCATIONS: the variant's
# local_size_x default becomes the count; Vulkan guarantees only 128 invocations per workgroup, so
# a device with fewer refuses such a pipeline, and the planner does not pick it there).
COOPERATIVE_INVOCATIONS = (2, 4, 8, 16, 32, 64)
WIDE_INVOCATIONS = (128, 256)
GRID_INVOCATIONS = COOPERATIVE_INVOCATIONS + WIDE_INVOCATIONS  # every count a grid may give


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
            c.error(data.line_of("grid"), "contract grid must be per_output_unit, {per_list_element: LIST_ARG[, element_units: SPEC]}, "
                    "{per_row: TENSOR}, {cooperative: TENSOR, invocations: N} (N in "
                    f"{', '.join(map(str, GRID_INVOCATIONS))}) or "
                    "{per_tile: TENSOR, width: W, height: H[, planes: P][, invocations: N]} (W, H, P positive, N as for cooperative)")
    if "spec" in data:
        _check_spec(c, data)
    units = grid.get("element_units") if isinstance(grid, dict) else None
    if units is not None and units not in (data.get("spec") or {}):
        c.error(data.line_of("grid"), f"contract grid: element_units '{units}' is not a spec constant of the template")
    if "span" in data:
        span = c.mapping(data["span"], data.line_of("span"), "contract span")
        for axis, n in (span or {}).items():
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SPAN:
                c.error(span.line_of(axis), f"contract span of '{axis}' must be an int from 1 to {MAX_SPAN}, got {n!r}")
    if "texel_reads" in data:
        names = data["texel_reads"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            c.error(data.line_of("texel_reads"),
                    f"contract texel_reads must be a list of distinct tensor names, got {names!r}")
    return Contract(file, data)


def _check_spec(c: Checker, data: LMap) -> None:
    """Each `spec` entry names one rule of SPEC_RULES with exactly its parameters."""
    spec = c.mapping(data["spec"], data.line_of("spec"), "contract spec")
    for name, raw in (spec or {}).items():
        line = spec.line_of(name)
        if not isinstance(name, str) or not SPEC_NAME_RE.match(name):
            c.error(line, f"spec constant '{name}' must be a lower_snake_case name")
            continue
        rules = [k for k in raw if k in SPEC_RULES] if isinstance(raw, dict) else []
        if len(rules) != 1:
            first = next(iter(raw), raw) if isinstance(raw, dict) else raw
            c.error(line, f"spec constant '{name}' names no spec rule '{first}'{did_you_mean(first, SPEC_RULES)}; "
                    f"rules: {', '.join(sorted(SPEC_RULES))} (shaders/node_rules.py)")
            continue
        rule = SPEC_RULES[rules[0]]
        given = set(raw) - {rule.name}
        if given != set(rule.required):
            need = ", ".join([rule.name, *rule.required])
            c.error(line, f"spec constant '{name}': rule '{rule.name}' takes exactly {need}, got {', '.join(sorted(raw))}")


def resolve_spec(contract: Contract, resolve, where: str, out: Collector) -> tuple[SpecDerivation, ...]:
    """The contract's spec constants for one op: tensor references (names, in0, in1, ...,
    `inputs`, `outputs`) resolved by `resolve(ref) -> [names] | None`; a reference the op lacks
    is an error naming the template and the op."""
    data = contract.data
    result = []
    for name, raw in (data.get("spec") or {}).items():
        rules = [k for k in raw if k in SPEC_RULES] if isinstance(raw, dict) else []
        if len(rules) != 1:
            continue  # reported when the contract was parsed
        rule = SPEC_RULES[rules[0]]
        params = []
        for key, value in raw.items():
            if key in rule.tensor_params:
                names = []
                for ref in ([value] if isinstance(value, str) else list(value or ())):
                    got = resolve(ref)
                    if got is None:
                        out.error(contract.file, data["spec"].line_of(name), f"{where}: spec constant '{name}' names "
                                  f"tensor '{ref}', which the op does not have")
                        return ()
                    names += got
                value = names[0] if key != rule.name or isinstance(value, str) and len(names) == 1 else tuple(names)
                if key == "of" and len(names) != 1:
                    out.error(contract.file, data["spec"].line_of(name), f"{where}: spec constant '{name}': "
                              f"`of` must name one tensor")
                    return ()
            params.append((str(key), value))
        result.append(SpecDerivation(str(name), rule.name, tuple(sorted(params)), rule.general))
    return tuple(result)


def contract_texel_reads(contract: Contract, resolve, where: str, out: Collector) -> tuple[str, ...]:
    """The inputs a template may read through uniform texel buffers (contract `texel_reads`),
    resolved for one op; a name the op lacks, or one of its outputs, is an error naming both."""
    refs = contract.data.get("texel_reads") or ()
    if not isinstance(refs, list):
        return ()  # reported when the contract was parsed
    names = []
    for ref in refs:
        got = resolve(ref)
        if got is None:
            out.error(contract.file, contract.line_of("texel_reads"), f"{where}: texel_reads names tensor "
                      f"'{ref}', which the op does not have as an input")
            return ()
        names += got
    return tuple(dict.fromkeys(names))


def contract_span(contract: Contract) -> tuple[tuple[str, int], ...]:
    """Units of `out` per invocation, by out's storage axis (contract `span`)."""
    return tuple(sorted((str(k), int(v)) for k, v in (contract.data.get("span") or {}).items()))


def _valid_grid(g) -> bool:
    """One of the mapping forms of `grid`."""
    if set(g) == {"cooperative", "invocations"}:
        n = g["invocations"]
        return isinstance(g["cooperative"], str) and isinstance(n, int) and n in GRID_INVOCATIONS
    if {"per_tile", "width", "height"} <= set(g) <= {"per_tile", "width", "height", "planes", "invocations"}:
        sizes = (g["width"], g["height"], g.get("planes", 1))
        n = g.get("invocations", 1)
        return (isinstance(g["per_tile"], str) and all(isinstance(v, int) and v > 0 for v in sizes)
                and isinstance(n, int) and n in (1,) + GRID_INVOCATIONS)
    if "per_list_element" in g and set(g) <= {"per_list_element", "element_units"}:
        return all(isinstance(v, str) for v in g.values())
    return len(g) == 1 and list(g)[0] in GRIDS[1:3] and isinstance(next(iter(g.values())), str)


def _empty(line: int) -> LMap:
    data = LMap()
    data.line, data.key_lines = line, {}
    return data
