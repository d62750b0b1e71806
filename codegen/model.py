"""The typed model both YAML files are parsed into; every emitter is a pure function of it."""

from __future__ import annotations

from dataclasses import dataclass, field

WHCN = ("W", "H", "C", "N")


@dataclass(frozen=True)
class StorageSpec:
    name: str
    id: int
    axis: str  # the name of this storage on the storage variant axes ("buffer", "texture3d")
    kind: str  # how a shader declares it: "buffer" (a block of words) or "image"
    image_dims: int | None  # dimensionality of an image; None for buffers
    descriptor: str  # Vulkan descriptor type without VK_DESCRIPTOR_TYPE_
    doc: str

    @property
    def is_image(self) -> bool:
        return self.kind == "image"


@dataclass(frozen=True)
class FamilySpec:
    name: str
    dtypes: tuple[str, ...]
    doc: str


@dataclass(frozen=True)
class DtypeSpec:
    """One element type, keyed by its name (layouts.yaml `dtypes` documents every field)."""

    name: str
    bytes: int  # host (torch) bytes of one element
    glsl: str  # shader scalar type
    torch: str
    family: str
    vec4: str = "vec4"  # shader 4-lane type
    lane_bytes: int = 4  # bytes of one stored element (buffer lane or texel channel)
    image: str | None = None  # GLSL image type stem ("image", "iimage"); None: no image
    image_format: str | None = None  # GLSL storage-image format qualifier ("rgba32f")
    vk_format: str | None = None  # VkFormat without VK_FORMAT_
    features: tuple[str, ...] = ()  # Vulkan device features a shader using it requires
    extensions: tuple[str, ...] = ()  # GLSL extensions a shader using it enables
    # the types a shader computes in (T, VEC4): the stored ones, except for a dtype stored narrower
    # than it computes (float16 is stored as float16_t and computed in float; docs/precision.md)
    compute: str = ""
    compute_vec4: str = ""

    def image_type(self, storage: "StorageSpec") -> str | None:
        """The GLSL image type in `storage` ("iimage3D"); None for buffers or imageless dtypes."""
        if not storage.is_image or self.image is None:
            return None
        return f"{self.image}{storage.image_dims}D"


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

    def storage_by_axis(self, axis: str) -> StorageSpec:
        return next(s for s in self.storages if s.axis == axis)


    def layout(self, name: str) -> LayoutSpec:
        return next(x for x in self.layouts if x.name == name)

    def dtype(self, name: str) -> DtypeSpec:
        return next(d for d in self.dtypes if d.name == name)

    @property
    def device_features(self) -> tuple[str, ...]:
        """Every device feature some dtype requires, sorted."""
        return tuple(sorted({f for d in self.dtypes for f in d.features}))

    def repset(self, name: str) -> RepSetSpec:
        return next(r for r in self.repsets if r.name == name)


@dataclass(frozen=True)
class ArgSpec:
    """An argument as torch's schema has it (kind, optional, default), plus our repset or enum values."""

    name: str
    kind: str  # "tensor", "tensor_list", "float", "int", "bool", "enum", "int_list", "any"
    repset: str | None = None
    optional: bool = False
    default: object = None
    values: tuple[str, ...] = ()  # for enum
    has_default: bool = False
    line: int = 0

    @property
    def is_tensor(self) -> bool:
        return self.kind in ("tensor", "tensor_list")


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
    read_outputs: tuple[str, ...] = ()  # outputs the shader also reads (bound read-write)
    target_env: str = "vulkan1.1"
    line: int = 0


@dataclass(frozen=True)
class PushSpec:
    """A push constant and how the runtime derives it (a rule of shaders/node_rules.py)."""

    name: str
    type: str  # int, float or ivec4
    rule: str
    params: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class SpecDerivation:
    """A plan-time specialization constant (a shape class) of a template contract's `spec`: the
    rule of shaders/node_rules.py SPEC_RULES the runtime evaluates once per dispatch, with its
    tensor references resolved for the op, and the rule's general value (the shader default)."""

    name: str
    rule: str
    params: tuple[tuple[str, object], ...]
    general: int


@dataclass(frozen=True)
class CheckSpec:
    """A condition a node must meet to run on Vulkan (a rule of shaders/node_rules.py)."""

    rule: str
    params: tuple[tuple[str, object], ...]


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
    push: tuple[PushSpec, ...]
    checks: tuple[CheckSpec, ...]
    # ("per_output_unit",), ("per_list_element", LIST_ARG), ("per_row", TENSOR),
    # ("cooperative", TENSOR, INVOCATIONS) or ("per_tile", TENSOR, WIDTH, HEIGHT, PLANES, INVOCATIONS)
    # (PLANES 0: every W-H plane)
    grid: tuple
    shader: ShaderSpec | None
    doc: str
    samples: tuple[tuple[tuple[str, object], ...], ...] = ()
    sample_values: tuple[tuple[str, tuple[float, float]], ...] = ()
    line: int = 0
    # tensors of a fixed dtype (a comparison's bool `out`, where's bool `condition`); every other
    # tensor has the variant's dtype, one of `dtypes`
    dtype_of: tuple[tuple[str, str], ...] = ()
    # tensor -> the torch dim order its kernel computes in (an NHWC conv's input: (0, 2, 3, 1));
    # lowering (runtime/graph/permutes/dim_order.py) inserts explicit permutes around the node
    dim_order: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # the template contract's shape classes (`spec`) and units of `out` per invocation (`span`,
    # by out's storage axis; 1 where not given)
    spec: tuple[SpecDerivation, ...] = ()
    span: tuple[tuple[str, int], ...] = ()
    # inputs that, bound as float buffers, also get a uniform texel buffer binding (contract
    # `texel_reads`; codegen/variants.py adds the bindings and the `texel_reads` spec constant)
    texel_reads: tuple[str, ...] = ()

    @property
    def tensors(self) -> tuple[str, ...]:
        """Bound tensors in binding order: outputs first, then tensor args."""
        return tuple(o.name for o in self.outputs) + tuple(a.name for a in self.args if a.is_tensor)

    def tensor_dtype(self, tensor: str, variant_dtype: str) -> str:
        """The dtype of `tensor` in the variant of dtype `variant_dtype`."""
        return dict(self.dtype_of).get(tensor, variant_dtype)


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
    # a shape class: the SPEC_RULES rule the runtime evaluates, with its params (None: local
    # sizes and layouts, which the program sets from the bound tensors)
    rule: str | None = None
    params: tuple[tuple[str, object], ...] = ()


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
    features: tuple[str, ...] = ()  # device features its dtype and its choice axis values require
    # per choice axis, the index of its value in ops.yaml's order of preference: of the variants
    # that fit a node and the device, the runtime takes the smallest
    preference: tuple[int, ...] = ()
    # units of `out` each invocation handles (contract `span`): the grid launches
    # ceil(units / span) invocations, and pc.units stays the count of units
    span: int = 1


@dataclass(frozen=True)
class OpsModel:
    axes: tuple[tuple[str, tuple[str, ...]], ...]  # global axis order with allowed values
    # choice axes (code paths of one template): axis -> ((value, required device features), ...),
    # values in order of preference
    choices: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]
    dtype_sets: tuple[tuple[str, tuple[str, ...]], ...]
    ops: tuple[OpSpec, ...]
    variants: tuple[Variant, ...]
