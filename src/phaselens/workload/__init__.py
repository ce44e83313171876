"""Workload planning: the spec (`spec`), arrival processes, length distributions, trace readers,
prompt datasets, the planner (`plan`: spec -> Schedule)."""
