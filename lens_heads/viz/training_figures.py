"""Figures of a training run: its loss per step beside its held-out loss."""

from __future__ import annotations

import plotly.graph_objects as go

from lens_heads.viz.escape import esc
from lens_heads.viz.palette import PALETTE


def loss_curves(train_loss, eval_steps, eval_loss, *, title: str = "") -> go.Figure:
    """A training run's loss per step (each step's batch) and its held-out loss where it was measured."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(range(1, len(train_loss) + 1)), y=list(train_loss), mode="lines",
                             name="training batch", line=dict(color=PALETTE[0], width=1)))
    fig.add_trace(go.Scatter(x=list(eval_steps), y=list(eval_loss), mode="lines+markers", name="held out",
                             line=dict(color=PALETTE[1], width=2)))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss (nats per answer token)")
    fig.update_layout(title=esc(title), width=900, height=450)
    return fig
