"""texelflow's own decompositions of shape ops torch leaves whole or breaks into as_strided.

torch decomposes `split_with_sizes` (which `split` and `chunk` become) into `as_strided` views,
which no Vulkan kernel computes, and `unbind` into a slice and a squeeze per output (two copies
where a texture's squeeze moves texels). Here each output is one `slice` or one `select` node, so
a split runs as one dispatch per piece and each piece gets its own planned representation.
`repeat` (and `tile`, which torch decomposes to it) becomes one expand and a view.
`decompose.decomposition_of` consults OWN_DECOMPOSITIONS (by target name) before torch's tables.
"""

from __future__ import annotations


def split_with_sizes(self, split_sizes, dim=0):
    """self.split_with_sizes(split_sizes, dim) as slices along `dim`."""
    import torch

    pieces, start = [], 0
    for size in split_sizes:
        pieces.append(torch.ops.aten.slice.Tensor(self, dim, start, start + size))
        start += size
    return pieces


def unbind(self, dim=0):
    """self.unbind(dim) as one select per index along `dim`."""
    import torch

    return [torch.ops.aten.select.int(self, dim, i) for i in range(self.shape[dim])]


def repeat(self, repeats):
    """self.repeat(repeats) as one expand between two reshapes: a repeated dim of size s > 1
    becomes (1, s) expanded to (r, s), one of size 1 expands in place, and runs of dims not
    repeated merge into one, so the expand's rank stays low (<= 7 for the kernels); then the
    result is merged to r * s per dim. torch has no decomposition of repeat (tile has, to it)."""
    import torch

    aten = torch.ops.aten
    shape = [1] * (len(repeats) - self.dim()) + list(self.shape)
    split, expanded, merging = [], [], False
    for r, size in zip(repeats, shape):
        if r == 1 and merging:  # a run of dims not repeated: one dim
            split[-1] *= size
            expanded[-1] *= size
        elif r == 1 or size == 1:
            split.append(size)
            expanded.append(size * r)
        else:
            split += [1, size]
            expanded += [r, size]
        merging = r == 1
    x = aten.expand.default(aten.reshape.default(self, split), expanded)
    return aten.reshape.default(x, [r * size for r, size in zip(repeats, shape)])


OWN_DECOMPOSITIONS = {
    "aten.repeat.default": repeat,
    "aten.split_with_sizes.default": split_with_sizes,
    "aten.split_with_sizes_copy.default": split_with_sizes,
    "aten.unbind.int": unbind,
    "aten.unbind_copy.int": unbind,
}
