"""Figures and views: plotly figures (plots), circuitsvis attention patterns (attention), the head explorer (explorer: data, explorer_view: the self-contained view)."""
