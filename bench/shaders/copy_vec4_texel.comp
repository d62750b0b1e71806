#version 450
// Ceiling kernel: copy_vec4.comp with its source read as a uniform texel buffer (vec4 texel k =
// word k), as kernels with contract texel_reads read buffers: `per_invocation` words per
// invocation, each invocation's words one grid-stride apart.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const int per_invocation = 1;
layout(constant_id = 4) const int pairs = 0;  // 1: words 2u, 2u + 1 of per_invocation / 2 regions
layout(set = 0, binding = 0) writeonly buffer Out { vec4 v[]; } t_out;
layout(set = 0, binding = 1) uniform samplerBuffer t_self;  // the source as vec4 texels (word k = texel k)
layout(push_constant) uniform PushConstants { int units; int words; } pc;

void main() {
  int u = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x);
  if (u >= pc.units) { return; }
  for (int k = 0; k < per_invocation; ++k) {
    int w = pairs != 0 ? 2 * u + (k / 2) * 2 * pc.units + k % 2 : u + k * pc.units;
    if (w < pc.words) { t_out.v[w] = texelFetch(t_self, w); }
  }
}
