"""Reports: the HTML pages (run, comparison, capacity search, sweep), the terminal summary and
a Perfetto trace.

`page` what every page shares; `html` (with `sections`, `figdata`) the run report; `compare`
the comparison; `capacity_page` the capacity and sweep pages; `figures` and the `fig_*`
builders draw; `headline` and `terminal` the run's numbers in a line or a table; `perfetto` the
trace.

Why separate from analysis: analysis computes numbers (pure functions of a Run); this package
only draws them, so every number on a page can be traced back to one analysis function.
"""
