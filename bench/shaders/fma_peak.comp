#version 450
// Ceiling kernel: arithmetic peak. Each invocation runs 8 independent vec4 FMA chains in
// registers for `iterations` steps (8 * 4 lanes * 2 FLOPs per step) and writes one vec4, so
// memory traffic is negligible. The host checks the written value against the same recurrence.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const int iterations = 256;
layout(set = 0, binding = 0) writeonly buffer Out { vec4 v[]; } t_out;
layout(push_constant) uniform PushConstants { int units; float a; float b; } pc;

void main() {
  int u = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x);
  if (u >= pc.units) { return; }
  vec4 a = vec4(pc.a);
  vec4 b = vec4(pc.b);
  float s = float(u & 7) * 0.125;  // depends on the invocation, so nothing folds
  vec4 c0 = vec4(s + 0.0), c1 = vec4(s + 1.0), c2 = vec4(s + 2.0), c3 = vec4(s + 3.0);
  vec4 c4 = vec4(s + 4.0), c5 = vec4(s + 5.0), c6 = vec4(s + 6.0), c7 = vec4(s + 7.0);
  // The body is unrolled 8 steps deep: on lavapipe a loop iteration's own bookkeeping (the
  // execution mask) costs as much as a few FMAs, and a rolled loop measured ~4x below this one.
  // `iterations` is a multiple of 8 (the host checks it).
  for (int i = 0; i < iterations; i += 8) {
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
    c0 = fma(c0, a, b); c1 = fma(c1, a, b); c2 = fma(c2, a, b); c3 = fma(c3, a, b);
    c4 = fma(c4, a, b); c5 = fma(c5, a, b); c6 = fma(c6, a, b); c7 = fma(c7, a, b);
  }
  t_out.v[u] = ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7));
}
