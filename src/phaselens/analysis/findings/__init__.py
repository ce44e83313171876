"""Findings: the diagnosis rules of DESIGN.md, each a plain function over the computed analysis.

Why plain functions in a plain tuple (`rules.RULES`): a rule is read, tested and tuned alone.
Each returns the findings it fires (with the numbers that fired it and the thresholds, so a
reader can disagree) or `Missing(needs)` when the data it needs is not in the run — then it does
not fire and is listed under `not_evaluated` with what it needed. One module per family of rules
(`load`, `slo`, `utilization`, `prefill`, `kv`, `host`, `lengths`); thresholds are constants at
the top of each, documented in docs/analysis.md.
"""

from phaselens.analysis.findings.base import Analysis, Missing
from phaselens.analysis.findings.rules import CODES, RULES, diagnose

__all__ = ["CODES", "RULES", "Analysis", "Missing", "diagnose"]
