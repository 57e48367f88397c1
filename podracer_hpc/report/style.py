"""Colours, markers and empty-panel text shared by the report's figures."""

from __future__ import annotations

from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
ACTION_MARKERS = {
    "keep": ("o", "kept its agent"),
    "copy_pod": ("^", "copied a pod of this round"),
    "load_entry": ("s", "loaded a leaderboard entry"),
    "reset": ("X", "re-initialized (NaN)"),
    "external": ("D", "loaded another job's entry"),
}


def series_color(i: int) -> str:
    """The i-th of COLORS, cycling."""
    return COLORS[i % len(COLORS)]


def empty_panel(ax: Any, msg: str) -> None:
    """A panel with nothing to draw: ``msg`` in its middle, no ticks."""
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, wrap=True, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
