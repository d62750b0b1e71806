"""Test-side names for the synthetic graph builder (runtime/graph/synthetic.py)."""

from texelflow.runtime.graph.synthetic import GraphBuilder as Builder  # noqa: F401
from texelflow.runtime.graph.synthetic import variant_of  # noqa: F401
