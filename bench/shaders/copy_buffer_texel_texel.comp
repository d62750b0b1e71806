#version 450
// Ceiling kernel: a buffer -> rgba32f 3-D image copy, vec4 word i to texel i (x fastest, then y,
// then z), `per_invocation` texels of one row per invocation: what any buffer -> texture transition
// must at least do (read every word once, write every texel once), with no re-layout; the buffer
// read as a uniform texel buffer (vec4 texel i = word i), as kernels with contract texel_reads do.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const int per_invocation = 1;
layout(set = 0, binding = 0, rgba32f) uniform writeonly image3D t_out;
layout(set = 0, binding = 1) uniform samplerBuffer t_self;
layout(push_constant) uniform PushConstants { ivec4 extents; int units; } pc;

void main() {
  int u = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x);
  if (u >= pc.units) { return; }
  int chunks = (pc.extents.x + per_invocation - 1) / per_invocation;
  int row = u / chunks;
  ivec3 pos = ivec3((u - row * chunks) * per_invocation, row % pc.extents.y, row / pc.extents.y);
  int word = row * pc.extents.x + pos.x;
  for (int k = 0; k < per_invocation; ++k) {
    if (pos.x < pc.extents.x) { imageStore(t_out, pos, texelFetch(t_self, word)); }
    pos.x += 1;
    word += 1;
  }
}
