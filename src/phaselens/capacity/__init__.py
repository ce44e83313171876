"""Capacity: the highest load a server holds inside the SLO, measured; its pages."""
