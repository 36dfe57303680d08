"""`oracular evaluate --plot`: calibration, ROC, precision/recall and effective weights."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from engine.evaluate import Evaluation, IntentScore, precision_recall_curve, roc_curve


def supported_formats() -> set[str]:
    """The file suffixes matplotlib can write (png, pdf, svg, ...).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return set(Figure().canvas.get_supported_filetypes())


def plot_evaluation(evaluation: Evaluation, path: str | Path) -> None:
    """Draw one row per intent: calibration with each bin's count, ROC, precision/recall with
    the reveal rule's point, and effective weights over time; each title carries its figures,
    and every legend sits outside its data.

    Raises:
        ImportError: matplotlib is not installed (`pip install 'oracular-streams[plot]'`).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    rows = max(len(evaluation.scores), 1)
    figure, axes = plt.subplots(rows, 4, figsize=(22, 4.8 * rows), squeeze=False)
    for row, score in zip(axes, evaluation.scores, strict=False):
        scored = evaluation.scored.get(score.intent, [])
        _calibration(row[0], score)
        _roc(row[1], score, scored)
        _precision_recall(row[2], score, scored)
        _weights(row[3], score.intent, evaluation.weights.get(score.intent, []))
    figure.tight_layout()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def _figure(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _unit_axes(axis: Any, xlabel: str, ylabel: str, title: str, *, top: float) -> None:
    """An axis of rates: x from 0 to 1, y from 0 to `top` (room for the labels above 1)."""
    axis.set(xlim=(0, 1), ylim=(0, top), xlabel=xlabel, ylabel=ylabel, title=title)


def _calibration(axis: Any, score: IntentScore) -> None:
    """Mean p against the observed rate per bin, each bin's count written at its point and
    drawn as bars on a second axis (a zigzag of bins of 100 predictions means little)."""
    bins = score.calibration
    axis.plot([0, 1], [0, 1], linestyle=":", color="grey")
    axis.plot([b.mean_p for b in bins], [b.observed for b in bins], marker="o", color="C0")
    for b in bins:
        axis.annotate(
            f"{b.count:,}",
            (b.mean_p, b.observed),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize="x-small",
        )
    counts = axis.twinx()
    counts.bar(
        [(b.low + b.high) / 2 for b in bins],
        [b.count for b in bins],
        width=0.09,
        alpha=0.15,
        color="C1",
    )
    counts.set_ylabel("predictions in the bin", color="C1")
    counts.set_yscale("log")
    _unit_axes(
        axis,
        "predicted p (bin mean; dotted: perfect)",
        "observed outcome rate",
        f"{score.intent}: calibration\nn={score.predictions:,}, "
        f"Brier {_figure(score.brier, 4)}, log loss {_figure(score.log_loss)}",
        top=1.05,
    )


def _roc(axis: Any, score: IntentScore, scored: list[tuple[float, bool, bool]]) -> None:
    curve = roc_curve([(p, label) for p, label, _ in scored])
    axis.plot([0, 1], [0, 1], linestyle=":", color="grey")
    if curve:
        axis.plot([x for x, _ in curve], [y for _, y in curve], color="C0")
    _unit_axes(
        axis,
        "false positive rate (dotted: a coin toss)",
        "true positive rate",
        f"{score.intent}: ROC, AUC {_figure(score.auc)}\n"
        f"({score.positives:,} of {score.predictions:,} followed by the outcome)",
        top=1.02,
    )


def _precision_recall(
    axis: Any, score: IntentScore, scored: list[tuple[float, bool, bool]]
) -> None:
    curve = precision_recall_curve([(p, label) for p, label, _ in scored])
    if curve:
        axis.plot([r for r, _ in curve], [p for _, p in curve], color="C0")
        base = score.positives / score.predictions
        axis.axhline(base, linestyle=":", color="grey")
    if score.precision is not None and score.recall is not None:
        axis.plot([score.recall], [score.precision], marker="*", markersize=14, color="C3")
        axis.annotate(
            "reveal",
            (score.recall, score.precision),
            textcoords="offset points",
            xytext=(8, -4),
            color="C3",
        )
    _unit_axes(
        axis,
        "recall (dotted: the base rate)",
        "precision",
        f"{score.intent}: precision/recall\nreveal: {score.reveals:,} reveals, "
        f"precision {_figure(score.precision)}, recall {_figure(score.recall)}",
        top=1.02,
    )


def _weights(axis: Any, intent: str, weights: list[tuple[int, str, float]]) -> None:
    by_signal: dict[str, list[tuple[int, float]]] = {}
    for at, signal, weight in weights:
        by_signal.setdefault(signal, []).append((at, weight))
    for signal, points in sorted(by_signal.items()):
        start = points[0][0]
        axis.plot(
            [(at - start) / 86_400_000 for at, _ in points],
            [w for _, w in points],
            marker=".",
            linestyle="none",
            label=signal,
        )
    axis.set(
        xlabel="days since the signal's first event",
        ylabel="effective weight",
        title=f"{intent}: effective weights\nwhen seen (all users)",
    )
    if by_signal:  # beside the axes, never over the points
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
