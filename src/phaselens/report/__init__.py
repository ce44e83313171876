"""Reports: the HTML pages (run, comparison), the terminal summary and a Perfetto trace.

Why separate from analysis: analysis computes numbers (pure functions of a Run); this package
only draws them, so every number on a page can be traced back to one analysis function.
"""
