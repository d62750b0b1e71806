#version 450
// Ceiling kernel: the most trivial buffer copy, one float per invocation, no index math.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) writeonly buffer Out { float v[]; } t_out;
layout(set = 0, binding = 1) readonly buffer In { float v[]; } t_self;
layout(push_constant) uniform PushConstants { int units; } pc;

void main() {
  int u = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x);
  if (u >= pc.units) { return; }
  t_out.v[u] = t_self.v[u];
}
