"""Read and validate layouts.yaml into a LayoutsModel, reporting every problem with its line."""

from __future__ import annotations

from .checks import Checker
from .diagnostics import Collector, did_you_mean
from .model import DtypeSpec, FamilySpec, LayoutSpec, LayoutsModel, RepSetSpec, StorageSpec
from .yamlsrc import LMap

TOP_KEYS = ("storages", "families", "dtypes", "layouts", "preference", "texture_limits", "repsets")
SET_OPS = ("union", "intersection", "difference")
STORAGE_KINDS = {"buffer": "STORAGE_BUFFER", "image": "STORAGE_IMAGE"}  # kind -> its descriptor type
# Vulkan device features a dtype or a choice axis value (ops.yaml) may require: the ones
# runtime/vulkan/device.py can read.
KNOWN_FEATURES = (
    "shaderFloat16", "shaderInt8", "shaderInt16", "shaderInt64", "shaderFloat64",
    "storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storageBuffer8BitAccess",
    "uniformAndStorageBuffer8BitAccess", "shaderStorageImageExtendedFormats", "shaderIntegerDotProduct",
)
DTYPE_KEYS = ("family", "bytes", "torch", "glsl", "vec4", "lane_bytes", "image", "image_format", "vk_format",
              "features", "extensions")
# A dtype stored narrower than it computes (float16: stored as float16_t, computed in float) names
# its arithmetic types; they default to the stored ones (glsl, vec4).
DTYPE_OPTIONAL_KEYS = ("compute", "compute_vec4")


def parse_layouts(data: LMap, file: str, out: Collector) -> LayoutsModel | None:
    """Validate `data` (from yamlsrc.load); None when problems were recorded in `out`."""
    c = Checker(file, out)
    before = len(out.items)
    c.keys(data, "layouts.yaml", TOP_KEYS)

    storages = _storages(c, data.get("storages"), data.line_of("storages"))
    family_names = _family_names(c, data.get("families"), data.line_of("families"))
    dtypes = _dtypes(c, data.get("dtypes"), data.line_of("dtypes"), family_names)
    families = _families(data.get("families"), family_names, dtypes)
    layouts = _layouts(c, data.get("layouts"), data.line_of("layouts"), storages, families)
    st_pref, ly_pref = _preference(c, data.get("preference"), data.line_of("preference"), storages, layouts)
    limits = _limits(c, data.get("texture_limits"), data.line_of("texture_limits"))
    repsets = _repsets(c, data.get("repsets"), data.line_of("repsets"), storages, families, layouts)
    if len(out.items) != before:
        return None
    return LayoutsModel(
        storages=tuple(sorted(storages, key=lambda s: s.id)),
        families=tuple(families),
        dtypes=tuple(dtypes),
        layouts=tuple(sorted(layouts, key=lambda x: x.id)),
        storage_preference=st_pref,
        layout_preference=ly_pref,
        texture_limits=limits,
        repsets=tuple(repsets),
    )


def _storages(c: Checker, raw, line: int) -> list[StorageSpec]:
    result: list[StorageSpec] = []
    m = c.mapping(raw, line, "'storages'")
    if m is None:
        return result
    ids: dict[int, str] = {}
    axes: dict[str, str] = {}
    for name, body in m.items():
        where = f"storage '{name}'"
        b = c.mapping(body, m.line_of(name), where)
        if b is None or not c.keys(b, where, ("id", "axis", "kind", "descriptor"), ("image_dims", "doc")):
            continue
        sid = c.typed(b["id"], int, b.line_of("id"), f"{where} id")
        axis = c.typed(b["axis"], str, b.line_of("axis"), f"{where} axis")
        kind_ok = c.name_in(b["kind"], list(STORAGE_KINDS), b.line_of("kind"), "storage kind")
        desc_ok = c.name_in(b["descriptor"], sorted(set(STORAGE_KINDS.values())), b.line_of("descriptor"),
                            "descriptor type")
        if kind_ok and desc_ok and STORAGE_KINDS[b["kind"]] != b["descriptor"]:
            c.error(b.line_of("descriptor"), f"{where}: kind '{b['kind']}' is bound as "
                    f"{STORAGE_KINDS[b['kind']]}, not {b['descriptor']}")
            desc_ok = False
        dims = None
        dims_ok = True
        if kind_ok and b["kind"] == "image":
            if "image_dims" not in b:
                c.error(b.line, f"{where} is an image and needs 'image_dims' (1, 2 or 3)")
                dims_ok = False
            else:
                dims = c.typed(b["image_dims"], int, b.line_of("image_dims"), f"{where} image_dims")
                if dims is not None and dims not in (1, 2, 3):
                    c.error(b.line_of("image_dims"), f"{where} image_dims must be 1, 2 or 3, found {dims}")
                    dims = None
                dims_ok = dims is not None
        elif "image_dims" in b:
            c.error(b.line_of("image_dims"), f"{where} is a {b['kind']}, which has no image_dims")
            dims_ok = False
        if axis is not None and axis in axes:
            c.error(b.line_of("axis"), f"{where} reuses axis name '{axis}' of '{axes[axis]}'")
        if sid is not None and sid in ids:
            c.error(b.line_of("id"), f"{where} reuses id {sid} of '{ids[sid]}'")
        if None in (sid, axis) or not (kind_ok and desc_ok and dims_ok):
            continue
        ids[sid], axes[axis] = name, name
        result.append(StorageSpec(name, sid, axis, b["kind"], dims, b["descriptor"], str(b.get("doc", ""))))
    return result


def _family_names(c: Checker, raw, line: int) -> list[str]:
    m = c.mapping(raw, line, "'families'")
    if m is None:
        return []
    names = []
    for name, body in m.items():
        b = c.mapping(body, m.line_of(name), f"family '{name}'")
        if b is not None and c.keys(b, f"family '{name}'", (), ("doc",)):
            names.append(name)
    return names


def _families(raw, names: list[str], dtypes: list[DtypeSpec]) -> list[FamilySpec]:
    """Each family with the dtypes that name it (a dtype declares its family, not the reverse)."""
    return [FamilySpec(n, tuple(d.name for d in dtypes if d.family == n), str(raw[n].get("doc", "")))
            for n in names]


def _optional_str(c: Checker, b, key: str, what: str) -> tuple[bool, str | None]:
    """(ok, value) of a string-or-null key."""
    if b[key] is None:
        return True, None
    v = c.typed(b[key], str, b.line_of(key), what)
    return v is not None, v


def _str_list(c: Checker, b, key: str, what: str) -> tuple[str, ...] | None:
    items = c.listing(b[key], b.line_of(key), what)
    if items is None:
        return None
    if not all(c.typed(v, str, items.line_of(i), f"{what} item") is not None for i, v in enumerate(items)):
        return None
    return tuple(items)


def _dtypes(c: Checker, raw, line: int, family_names: list[str]) -> list[DtypeSpec]:
    result: list[DtypeSpec] = []
    m = c.mapping(raw, line, "'dtypes'")
    if m is None:
        return result
    for name, body in m.items():
        where = f"dtype '{name}'"
        b = c.mapping(body, m.line_of(name), where)
        if b is None or not c.keys(b, where, DTYPE_KEYS, DTYPE_OPTIONAL_KEYS):
            continue
        ok = c.name_in(b["family"], family_names, b.line_of("family"), "family")
        nbytes = c.typed(b["bytes"], int, b.line_of("bytes"), f"{where} bytes")
        lane_bytes = c.typed(b["lane_bytes"], int, b.line_of("lane_bytes"), f"{where} lane_bytes")
        for key in ("bytes", "lane_bytes"):
            v = b[key]
            if isinstance(v, int) and not isinstance(v, bool) and v not in (1, 2, 4, 8):
                c.error(b.line_of(key), f"{where} {key} must be 1, 2, 4 or 8, found {v}")
                ok = False
        strings = {k: c.typed(b[k], str, b.line_of(k), f"{where} {k}") for k in ("torch", "glsl", "vec4")}
        compute = {k: c.typed(b[k], str, b.line_of(k), f"{where} {k}") if k in b else strings[base]
                   for k, base in (("compute", "glsl"), ("compute_vec4", "vec4"))}
        ok &= all(v is not None for v in compute.values())
        optional = {k: _optional_str(c, b, k, f"{where} {k}") for k in ("image", "image_format", "vk_format")}
        ok &= all(v is not None for v in strings.values()) and all(o for o, _ in optional.values())
        image = {k: v for k, (_, v) in optional.items()}
        if ok and len({v is None for v in image.values()}) != 1:
            c.error(b.line_of("image"), f"{where}: image, image_format and vk_format are all given "
                    f"or all null (null: the dtype has no texture format)")
            ok = False
        features = _str_list(c, b, "features", f"{where} features")
        if features is not None:
            lst = b["features"]
            for i, f in enumerate(features):
                if not c.name_in(f, KNOWN_FEATURES, lst.line_of(i), "device feature"):
                    features = None
        extensions = _str_list(c, b, "extensions", f"{where} extensions")
        if not ok or None in (nbytes, lane_bytes, features, extensions):
            continue
        result.append(DtypeSpec(
            name=name, bytes=nbytes, glsl=strings["glsl"], torch=strings["torch"], family=b["family"],
            vec4=strings["vec4"], lane_bytes=lane_bytes, image=image["image"],
            image_format=image["image_format"], vk_format=image["vk_format"],
            features=features, extensions=extensions, compute=compute["compute"], compute_vec4=compute["compute_vec4"],
        ))
    return result


def _dim(c: Checker, value, line: int, what: str) -> int | None:
    v = c.typed(value, int, line, what)
    if v is not None and not 0 <= v <= 3:
        c.error(line, f"{what} must be a WHCN dim 0..3, found {v}")
        return None
    return v


def _layouts(c: Checker, raw, line: int, storages, families) -> list[LayoutSpec]:
    result: list[LayoutSpec] = []
    m = c.mapping(raw, line, "'layouts'")
    if m is None:
        return result
    storage_names = [s.name for s in storages]
    family_names = [f.name for f in families]
    ids: dict[int, str] = {}
    required = ("id", "short", "family", "packed_dim", "block", "outer_dim", "outer_block", "block_transposed", "storages")
    for name, body in m.items():
        where = f"layout '{name}'"
        b = c.mapping(body, m.line_of(name), where)
        if b is None or not c.keys(b, where, required, ("doc",)):
            continue
        lid = c.typed(b["id"], int, b.line_of("id"), f"{where} id")
        if lid is not None and lid in ids:
            c.error(b.line_of("id"), f"{where} reuses id {lid} of '{ids[lid]}'")
        if lid is not None:
            ids[lid] = name
        fam_ok = c.name_in(b["family"], family_names, b.line_of("family"), "family")
        packed = _dim(c, b["packed_dim"], b.line_of("packed_dim"), f"{where} packed_dim")
        outer = _dim(c, b["outer_dim"], b.line_of("outer_dim"), f"{where} outer_dim")
        outer_block = c.typed(b["outer_block"], int, b.line_of("outer_block"), f"{where} outer_block")
        transposed = c.typed(b["block_transposed"], bool, b.line_of("block_transposed"), f"{where} block_transposed")
        sts = c.listing(b["storages"], b.line_of("storages"), f"{where} storages")
        st_ok = sts is not None and all(
            c.name_in(s, storage_names, sts.line_of(i), "storage") for i, s in enumerate(sts)
        )
        blocks = c.mapping(b["block"], b.line_of("block"), f"{where} block")
        block_pairs: list[tuple[str, int]] = []
        if blocks is not None and st_ok:
            for st, size in blocks.items():
                if not c.name_in(st, storage_names, blocks.line_of(st), "storage"):
                    continue
                if st not in sts:
                    c.error(blocks.line_of(st), f"{where} gives a block for storage '{st}' it does not allow")
                if c.typed(size, int, blocks.line_of(st), f"{where} block") is not None:
                    block_pairs.append((st, size))
            for st in sts:
                if st not in blocks:
                    c.error(b.line_of("block"), f"{where} has no block size for its storage '{st}'")
        if packed is not None and outer is not None and packed == outer:
            c.error(b.line_of("outer_dim"), f"{where} outer_dim must differ from packed_dim")
        if None in (lid, packed, outer, outer_block, transposed) or not (fam_ok and st_ok):
            continue
        order = {s.name: s.id for s in storages}
        result.append(
            LayoutSpec(
                name=name,
                id=lid,
                short=str(b["short"]),
                family=b["family"],
                packed_dim=packed,
                block=tuple(sorted(block_pairs, key=lambda p: order[p[0]])),
                outer_dim=outer,
                outer_block=outer_block,
                block_transposed=transposed,
                storages=tuple(sorted(sts, key=order.__getitem__)),
                doc=str(b.get("doc", "")),
            )
        )
    return result


def _preference(c: Checker, raw, line: int, storages, layouts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    m = c.mapping(raw, line, "'preference'")
    if m is None or not c.keys(m, "'preference'", ("storages", "layouts")):
        return (), ()
    out = []
    for key, universe in (("storages", [s.name for s in storages]), ("layouts", [x.name for x in layouts])):
        items = c.listing(m[key], m.line_of(key), f"preference {key}")
        if items is None:
            out.append(())
            continue
        for i, item in enumerate(items):
            c.name_in(item, universe, items.line_of(i), key[:-1])
        missing = sorted(set(universe) - set(items))
        if missing:
            c.error(m.line_of(key), f"preference {key} must rank every one; missing {', '.join(missing)}")
        out.append(tuple(str(x) for x in items))
    return out[0], out[1]


def _limits(c: Checker, raw, line: int) -> tuple[int, int, int]:
    items = c.listing(raw, line, "'texture_limits'")
    if items is None:
        return (0, 0, 0)
    if len(items) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
        c.error(line, "texture_limits must be three positive integers (W, H, C*N extents)")
        return (0, 0, 0)
    return (items[0], items[1], items[2])


def _repsets(c: Checker, raw, line: int, storages, families, layouts) -> list[RepSetSpec]:
    """Evaluate the repset algebra in dependency order; cycles and unknown names are errors."""
    m = c.mapping(raw, line, "'repsets'")
    if m is None:
        return []
    storage_names = [s.name for s in storages]
    by_name = {x.name: x for x in layouts}
    values: dict[str, dict[str, frozenset[str]]] = {}
    visiting: set[str] = set()

    def evaluate(name: str) -> dict[str, frozenset[str]] | None:
        if name in values:
            return values[name]
        if name in visiting:
            c.error(m.line_of(name), f"repset '{name}' is defined in terms of itself")
            return None
        visiting.add(name)
        body = m[name]
        result = _evaluate_body(name, body, m.line_of(name))
        visiting.discard(name)
        if result is not None:
            values[name] = result
        return result

    def _evaluate_body(name, body, bline):
        b = c.mapping(body, bline, f"repset '{name}'")
        if b is None:
            return None
        ops = [k for k in b if k in SET_OPS]
        if ops:
            if len(b) != 1:
                c.error(b.line, f"repset '{name}' must be one set operation or a storage mapping, not both")
                return None
            op = ops[0]
            operands = c.listing(b[op], b.line_of(op), f"repset '{name}' {op}")
            if operands is None:
                return None
            if op == "difference" and len(operands) != 2:
                c.error(b.line_of(op), f"repset '{name}' difference takes exactly two repsets [A, B]")
                return None
            parts = []
            for i, operand in enumerate(operands):
                if not c.name_in(operand, list(m), operands.line_of(i), "repset"):
                    return None
                part = evaluate(operand)
                if part is None:
                    return None
                parts.append(part)
            return _combine(op, parts, storage_names)
        result = {s: frozenset() for s in storage_names}
        ok = True
        for st, sel in b.items():
            if not c.name_in(st, storage_names, b.line_of(st), "storage"):
                ok = False
                continue
            chosen = _select(c, sel, b.line_of(st), st, families, by_name, name)
            if chosen is None:
                ok = False
            else:
                result[st] = chosen
        return result if ok else None

    for name in m:
        evaluate(name)
    order = {s.name: s.id for s in storages}
    lorder = {x.name: x.id for x in layouts}
    specs = []
    for name in m:
        if name not in values:
            continue
        pairs = tuple(
            (st, tuple(sorted(values[name][st], key=lorder.__getitem__)))
            for st in sorted(storage_names, key=order.__getitem__)
        )
        specs.append(RepSetSpec(name, pairs, m.line_of(name)))
    return specs


def _select(c: Checker, sel, line: int, storage: str, families, by_name, repset: str) -> frozenset[str] | None:
    fam_names = [f.name for f in families]
    if isinstance(sel, str):
        if sel not in fam_names:
            c.error(line, f"repset '{repset}': '{sel}' is not a layout family; use a list of layouts"
                    f"{did_you_mean(sel, fam_names)}")
            return None
        return frozenset(x.name for x in by_name.values() if x.family == sel and storage in x.storages)
    items = c.listing(sel, line, f"repset '{repset}' {storage}")
    if items is None:
        return None
    chosen = set()
    for i, item in enumerate(items):
        if not c.name_in(item, list(by_name), items.line_of(i), "layout"):
            return None
        if storage not in by_name[item].storages:
            c.error(items.line_of(i), f"repset '{repset}': layout '{item}' is not allowed in storage '{storage}'")
            return None
        chosen.add(item)
    return frozenset(chosen)


def _combine(op: str, parts, storage_names) -> dict[str, frozenset[str]]:
    result = {}
    for st in storage_names:
        sets = [p[st] for p in parts]
        if op == "union":
            result[st] = frozenset().union(*sets)
        elif op == "intersection":
            result[st] = frozenset(sets[0]).intersection(*sets[1:])
        else:
            result[st] = sets[0] - sets[1]
    return result
