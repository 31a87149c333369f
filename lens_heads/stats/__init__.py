"""Numbers without a model: intervals, tests and rank statistics over items (inference); crossing rules, AUC and Table 2 arithmetic of accuracy-vs-share curves (curves)."""
