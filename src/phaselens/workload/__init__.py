"""Workload planning: arrival processes, length distributions, trace readers, the planner."""
