"""Host transfers planned once: where each element of a tensor's NCHW array lies in its packed bytes.

`packing.pack`/`unpack` rebuild padded, transposed copies of every array on every call (numpy
pad, moveaxis, reshape: tens of microseconds of Python even for four floats). A Program moves the
same tensors through the same host memory on every call, so it plans each transfer once, by
packing an array of element numbers with the very same `packing.pack` (so the two cannot
disagree): a call then writes with one numpy copy (a layout whose packed order is NCHW order)
or one indexed store, and reads back with one copy or one gather, into a new array the caller
owns. Lanes the elements do not cover (padding) are zeroed, as `pack` leaves them: once, when the
bytes are the host's alone (a staging region the device only reads), else on every write.

Only layouts with one element per lane (the float family: float32, int32, bool stored as int32
0 / 1) are planned; int8x4 words go through `pack`/`unpack` as before.
"""
from __future__ import annotations

import math

import numpy as np

from texelflow.runtime.vulkan import packing

# host dtype -> numpy type of one stored lane (bool: int32 0 / 1, read back as `lane != 0`)
_LANES = {"float32": np.float32, "int32": np.int32, "bool": np.int32}
MAX_INDEXED = 1 << 22  # elements; larger tensors whose packed order is not NCHW order use pack/unpack


class Transfer:
    """Moves one tensor's contiguous NCHW array in and out of `raw`, the host bytes (a uint8 view
    of mapped memory) that hold its packed form."""

    def __init__(self, tensor, raw: np.ndarray, *, host_only: bool = False):
        self.tensor, self.raw = tensor, raw
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self.count = math.prod(self.shape)
        self.planned = self.dtype in _LANES and self.count < 2 ** 31
        if not self.planned:
            return
        lanes = raw[: raw.nbytes - raw.nbytes % 4].view(_LANES[self.dtype])
        ids = np.arange(1, self.count + 1, dtype=np.int32).reshape(self.shape)
        where = packing.pack(ids, tensor.storage, tensor.layout).reshape(-1)  # element number + 1, 0 = padding
        covered = np.flatnonzero(where)
        index = np.empty(self.count, np.intp)
        index[where[covered] - 1] = covered
        self.lanes = lanes[: where.size]
        if np.array_equal(index, np.arange(self.count)):
            self.index = None  # packed order is NCHW order: a plain copy
            self.elements = self.lanes[: self.count].reshape(self.shape)
        elif self.count > MAX_INDEXED:  # an index this large costs more memory than it saves time
            self.planned = False
            return
        else:
            self.index = index
        self.padding = np.flatnonzero(where == 0) if covered.size < where.size else None
        if host_only and self.padding is not None:  # nothing else writes these bytes: zero them once
            self.lanes[self.padding] = 0
            self.padding = None

    def write(self, array) -> None:
        """Pack `array` (checked against the tensor's shape) into the host bytes."""
        arr = np.asarray(array)
        if arr.shape != self.shape:
            raise ValueError(f"array of shape {arr.shape} does not match tensor shape {self.shape}")
        if not self.planned:
            self.raw[:] = self.tensor.pack(arr)
            return
        if self.index is None:
            np.copyto(self.elements, arr, casting="unsafe")
        else:
            self.lanes[self.index] = arr.reshape(-1)
        if self.padding is not None:
            self.lanes[self.padding] = 0

    def direct(self, writing: bool) -> np.ndarray | None:
        """The tensor's elements in the host bytes as an NCHW array (a view), when the packed
        order is NCHW order (and, `writing`, no padding needs rewriting on each write): a caller
        may copy into or out of it directly (one copy, e.g. a torch view's copy_ or clone); else
        None (use write/read)."""
        if self.planned and self.index is None and (self.padding is None or not writing):
            return self.elements
        return None

    def put(self, arr: np.ndarray) -> None:
        """write() for an array the caller has already checked to have the tensor's shape (a
        compiled program's fast call): one copy into the packed bytes, no checks."""
        if self.planned and self.index is None and self.padding is None:
            np.copyto(self.elements, arr, casting="unsafe")
        else:
            self.write(arr)

    def read(self) -> np.ndarray:
        """A new contiguous NCHW array of the tensor from the host bytes (nothing shared with them)."""
        if not self.planned:
            return self.tensor.unpack(self.raw.copy())
        if self.index is None:
            data = self.elements.copy()
        else:
            data = self.lanes[self.index].reshape(self.shape)
        if self.dtype == "bool":
            return data != 0
        return data
