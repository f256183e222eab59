"""Observability for asyncrl runs: per-step metrics (``metrics``, its ``backends`` and ``trackers``), per-worker span
timelines (``timeline``), the rollout trace (``trace``) and PNG reports (``report``: matplotlib, which workers never
import).
"""
