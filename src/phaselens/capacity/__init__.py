"""Capacity: the highest load, the spec's whole mix scaled by one factor, a server holds inside
its SLO with confidence (docs/capacity.md). `scale` scales a spec, `probe` runs one load and
judges it, `search` finds the knee, `verdict` holds the interval and the queue rules."""
