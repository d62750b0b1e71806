"""texelflow.codegen: turns layouts.yaml and ops.yaml into the checked-in generated/ tree.

Never imports texelflow.runtime: data flows YAML -> codegen -> generated -> runtime.
"""
