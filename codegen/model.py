"""The typed model both YAML files are parsed into; every emitter is a pure function of it."""

from __future__ import annotations

from dataclasses import dataclass, field

WHCN = ("W", "H", "C", "N")


@dataclass(frozen=True)
class StorageSpec:
    name: str
    id: int
    glsl: str  # the name of this storage on the `storage` variant axes
    doc: str


@dataclass(frozen=True)
class FamilySpec:
    name: str
    dtypes: tuple[str, ...]
    doc: str


@dataclass(frozen=True)
class DtypeSpec:
    name: str
    bytes: int
    glsl: str
    torch: str
    family: str


@dataclass(frozen=True)
class LayoutSpec:
    name: str
    id: int
    short: str
    family: str
    packed_dim: int
    block: tuple[tuple[str, int], ...]  # (storage, block) pairs, sorted by storage id
    outer_dim: int
    outer_block: int
    block_transposed: bool
    storages: tuple[str, ...]
    doc: str

    def block_for(self, storage: str) -> int | None:
        return dict(self.block).get(storage)


@dataclass(frozen=True)
class RepSetSpec:
    """A named set of representations: storage name -> sorted layout names."""

    name: str
    layouts: tuple[tuple[str, tuple[str, ...]], ...]
    line: int

    def as_dict(self) -> dict[str, tuple[str, ...]]:
        return dict(self.layouts)

    def storages(self) -> tuple[str, ...]:
        return tuple(s for s, ls in self.layouts if ls)


@dataclass(frozen=True)
class LayoutsModel:
    storages: tuple[StorageSpec, ...]
    families: tuple[FamilySpec, ...]
    dtypes: tuple[DtypeSpec, ...]
    layouts: tuple[LayoutSpec, ...]
    storage_preference: tuple[str, ...]
    layout_preference: tuple[str, ...]
    texture_limits: tuple[int, int, int]
    repsets: tuple[RepSetSpec, ...]

    def storage(self, name: str) -> StorageSpec:
        return next(s for s in self.storages if s.name == name)

    def storage_by_glsl(self, glsl: str) -> StorageSpec:
        return next(s for s in self.storages if s.glsl == glsl)

    def layout(self, name: str) -> LayoutSpec:
        return next(x for x in self.layouts if x.name == name)

    def dtype(self, name: str) -> DtypeSpec:
        return next(d for d in self.dtypes if d.name == name)

    def repset(self, name: str) -> RepSetSpec:
        return next(r for r in self.repsets if r.name == name)


@dataclass(frozen=True)
class ArgSpec:
    name: str
    kind: str  # "tensor", "tensor_list", "float", "int", "bool", "enum", "int_list", "any"
    repset: str | None = None
    optional: bool = False
    default: object = None
    values: tuple[str, ...] = ()  # for enum
    line: int = 0

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("tensor", "tensor_list")

    @property
    def pushed(self) -> bool:
        """Scalars that reach the shader as push constants."""
        return self.kind in ("float", "int", "bool", "enum")


@dataclass(frozen=True)
class OutputSpec:
    name: str
    repset: str
    line: int = 0


@dataclass(frozen=True)
class ShaderSpec:
    template: str
    axes: tuple[str, ...]
    params: tuple[tuple[str, str], ...]
    storage_of: tuple[tuple[str, str], ...]  # tensor name -> axis giving its storage, or a fixed storage
    push: tuple[tuple[str, str], ...] = ()  # extra push constants (name, int|float|ivec4) the runtime fills
    read_outputs: tuple[str, ...] = ()  # outputs the shader also reads (bound read-write)
    target_env: str = "vulkan1.1"
    line: int = 0


@dataclass(frozen=True)
class OpSpec:
    name: str
    targets: tuple[str, ...]
    args: tuple[ArgSpec, ...]
    outputs: tuple[OutputSpec, ...]
    sync: tuple[tuple[str, ...], ...]
    dtypes: tuple[str, ...]
    flags: tuple[str, ...]
    weights: tuple[str, ...]
    dim_order: tuple[int, ...] | None
    shader: ShaderSpec | None
    doc: str
    line: int = 0

    @property
    def tensors(self) -> tuple[str, ...]:
        """Bound tensors in binding order: outputs first, then tensor args."""
        return tuple(o.name for o in self.outputs) + tuple(a.name for a in self.args if a.is_tensor)


@dataclass(frozen=True)
class Binding:
    index: int
    tensor: str
    descriptor: str
    access: str
    storage: str


@dataclass(frozen=True)
class PushConstant:
    name: str
    type: str
    offset: int
    size: int


@dataclass(frozen=True)
class SpecConstant:
    id: int
    name: str
    type: str
    default: int


@dataclass(frozen=True)
class Variant:
    """One compiled shader: an op at one point of its variant axes, with its reflection."""

    name: str
    op: str
    axes: tuple[tuple[str, str], ...]
    dtype: str
    source: str
    bindings: tuple[Binding, ...]
    push_constants: tuple[PushConstant, ...]
    push_constant_size: int
    spec_constants: tuple[SpecConstant, ...]
    target_env: str
    template: str
    params: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True)
class OpsModel:
    axes: tuple[tuple[str, tuple[str, ...]], ...]  # global axis order with allowed values
    dtype_sets: tuple[tuple[str, tuple[str, ...]], ...]
    ops: tuple[OpSpec, ...]
    variants: tuple[Variant, ...]
