"""scipy is loaded only when the optimal planner runs: `import texelflow` and the greedy planner
work without paying for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import texelflow
from texelflow.runtime.graph.plan import plan_graph
from tests.graph.synthetic import model_like
plan_graph(model_like(20), "greedy")
assert "scipy" not in sys.modules, "scipy was imported before the optimal planner ran"
plan_graph(model_like(20), "optimal")
assert "scipy" in sys.modules
"""


def test_scipy_is_imported_only_by_the_optimal_planner():
    subprocess.run([sys.executable, "-c", SCRIPT], check=True, cwd=Path(__file__).resolve().parents[2])
