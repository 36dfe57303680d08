"""`oracular evaluate --plot`: the calibration curve and effective weights over time."""

from __future__ import annotations

from pathlib import Path

from engine.evaluate import Evaluation


def supported_formats() -> set[str]:
    """The file suffixes matplotlib can write (png, pdf, svg, ...).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415

    return set(Figure().canvas.get_supported_filetypes())


def plot_evaluation(evaluation: Evaluation, path: str | Path) -> None:
    """Draw one row per intent: calibration (left), effective weights over time (right).

    Raises:
        ImportError: matplotlib is not installed (`pip install 'oracular-streams[plot]'`).
    """
    import matplotlib  # noqa: PLC0415 - optional dependency

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = max(len(evaluation.scores), 1)
    figure, axes = plt.subplots(rows, 2, figsize=(11, 4 * rows), squeeze=False)
    for (calibration_axis, weights_axis), score in zip(axes, evaluation.scores, strict=False):
        calibration_axis.plot([0, 1], [0, 1], linestyle=":", color="grey", label="perfect")
        calibration_axis.plot(
            [b.mean_p for b in score.calibration],
            [b.observed for b in score.calibration],
            marker="o",
            label=f"{score.intent} (n={score.predictions})",
        )
        calibration_axis.set(
            xlim=(0, 1),
            ylim=(0, 1),
            xlabel="predicted p",
            ylabel="observed outcome rate",
            title=f"{score.intent}: calibration",
        )
        calibration_axis.legend(loc="upper left")
        by_signal: dict[str, list[tuple[int, float]]] = {}
        for at, signal, weight in evaluation.weights.get(score.intent, []):
            by_signal.setdefault(signal, []).append((at, weight))
        for signal, points in sorted(by_signal.items()):
            start = points[0][0]
            weights_axis.plot(
                [(at - start) / 86_400_000 for at, _ in points],
                [w for _, w in points],
                marker=".",
                linestyle="none",
                label=signal,
            )
        weights_axis.set(
            xlabel="days since the signal's first event",
            ylabel="effective weight",
            title=f"{score.intent}: effective weights when seen (all users)",
        )
        if by_signal:
            weights_axis.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
