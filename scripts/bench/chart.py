"""The chart of a batch of JSON page views by records per batch (docs/benchmarks.png): records per second,
and CPU seconds per million records, one line per system."""

from __future__ import annotations

import os
from pathlib import Path

from bench.harness import CPU, CURVE


def draw_chart(path: Path) -> None:
    """Two panels, log-log, one line per system: records per second from the command's start (CURVE), where
    each wins; and, where measured, CPU seconds per million records of its own processes (CPU), what each
    costs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(CURVE, "records per second (whole command)", lambda n, s: n / s)]
    if CPU:
        panels.append((CPU, "CPU seconds per million records\n(its processes; not the broker's or Postgres')",
                       lambda n, s: s / (n / 1e6)))
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, 5.5 * len(panels)), dpi=110, squeeze=False)
    for (points_by_system, label, value), ax in zip(panels, axes[:, 0], strict=True):
        for system, points in sorted(points_by_system.items()):
            sizes = sorted(points)
            ax.plot(sizes, [value(n, points[n]) for n in sizes], marker="o", label=system,
                    linestyle="--" if system.startswith("plain") else "-")
        ax.set(xscale="log", yscale="log", xlabel="records per batch", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_title(f"A batch of JSON page views, from the command's start ({os.cpu_count()} cores, one machine)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    print(f"chart written to {path}")
