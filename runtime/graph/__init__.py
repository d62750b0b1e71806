"""Graph-side runtime: representation model, per-op repsets, passes and planners (no device)."""
