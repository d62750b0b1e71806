"""texelflow.runtime: graph passes and planning (runtime.graph, pure Python) and the Vulkan
layer (runtime.vulkan); each reads texelflow.generated and neither imports the other."""
