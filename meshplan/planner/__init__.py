"""The planner: search space, constraints, SAC ILP, stage split, placement, best-first search.

Library entry: `search(plan, profile) -> SearchResult` (fields of `plan` that are 'auto' are
searched, the rest fixed). The CLI is `meshplan plan` (commands/plan.py).
"""

from meshplan.planner.search import SearchResult, search

__all__ = ["SearchResult", "search"]
