"""Replica groups: one model id served by several engines, each request sent to the replica a
strategy picks among the healthy ones (circuits, cool-downs, active checks)."""
