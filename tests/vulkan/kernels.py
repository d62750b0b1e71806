"""Throwaway compute shaders for testing the pipeline/program machinery independently of codegen.

They follow the generated shaders' conventions (set 0, spec ids 0-2 = local size, one
`<tensor>_layout` spec constant per tensor, `ivec4 <tensor>_sizes` push constants in binding order,
then `int units`, then scalars) and are described by hand-built ShaderVariant reflections.
"""
from __future__ import annotations

import functools
import pathlib
import subprocess
import tempfile

from texelflow.generated.layouts import STORAGE_BY_AXIS, STORAGE_INFO
from texelflow.generated.variants import Binding, PushConstant, ShaderVariant, SpecConstant

_HEADER = """#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const int out_layout = 0;
layout(constant_id = 4) const int self_layout = 0;
layout(push_constant) uniform PC { ivec4 out_sizes; ivec4 self_sizes; int units; float alpha; };
uint invocation() {
  return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}
"""

_BODY = {
    "buffer": """
layout(set = 0, binding = 0) writeonly buffer OutBuf { float out_data[]; };
layout(set = 0, binding = 1) readonly buffer InBuf { float in_data[]; };
void main() {
  uint g = invocation();
  if (g >= uint(units)) return;
  out_data[g] = in_data[g] + alpha;
}
""",
    "texture3d": """
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D out_img;
layout(set = 0, binding = 1, rgba32f) uniform readonly image3D in_img;
void main() {
  int g = int(invocation());
  if (g >= units) return;
  ivec3 e = imageSize(out_img);
  ivec3 p = ivec3(g % e.x, (g / e.x) % e.y, g / (e.x * e.y));
  imageStore(out_img, p, imageLoad(in_img, p) + vec4(alpha));
}
""",
}


@functools.lru_cache(maxsize=None)
def add_scalar(storage: str) -> tuple[ShaderVariant, bytes]:
    """`out = self + alpha` over every unit, for 'buffer' or 'texture3d' float32 tensors."""
    descriptor = STORAGE_INFO[STORAGE_BY_AXIS[storage]].descriptor
    variant = ShaderVariant(
        name=f"test_add_scalar_{storage}", op="test_add_scalar", axes=(("storage", storage),), dtype="float32",
        source=f"test_add_scalar_{storage}.comp",
        bindings=(Binding(0, "out", descriptor, "write", storage), Binding(1, "self", descriptor, "read", storage)),
        push_constants=(PushConstant("out_sizes", "ivec4", 0, 16), PushConstant("self_sizes", "ivec4", 16, 16),
                        PushConstant("units", "int", 32, 4), PushConstant("alpha", "float", 36, 4)),
        push_constant_size=40,
        spec_constants=(SpecConstant(0, "local_size_x", "int", 64), SpecConstant(1, "local_size_y", "int", 1),
                        SpecConstant(2, "local_size_z", "int", 1), SpecConstant(3, "out_layout", "int", 0),
                        SpecConstant(4, "self_layout", "int", 0)),
        target_env="vulkan1.1",
    )
    with tempfile.TemporaryDirectory() as d:
        src, spv = pathlib.Path(d) / variant.source, pathlib.Path(d) / "out.spv"
        src.write_text(_HEADER + _BODY[storage])
        subprocess.run(["glslc", "--target-env=vulkan1.1", "-fshader-stage=compute", str(src), "-o", str(spv)],
                       check=True, capture_output=True)
        return variant, spv.read_bytes()
