"""The plots of a run's report: accuracy against speedup (with intervals), acceptance by draft position, the
running accuracy difference against the reference as problems came in, and the accuracy difference against tau."""

from __future__ import annotations

from pathlib import Path

from .paired import confidence_path, normal_path


def plot(summary: dict, run_dir: Path) -> list[Path]:
    """accuracy_vs_speedup.png (with intervals), acceptance_by_position.png and, where methods are paired
    against the reference, running_difference.png and difference_vs_tau.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grader = summary["grader"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["methods"].items():
        if not m["speedup_problems"]:  # no row timed on the reference's machine: no speedup to place it at
            continue
        a = m["accuracy"][grader]
        ax.errorbar(m["speedup"], 100 * a["acc"], yerr=[[100 * (a["acc"] - a["ci95"][0])],
                    [100 * (a["ci95"][1] - a["acc"])]], fmt="o", capsize=4, label=name)
    ax.set_xlabel(f"speedup vs {summary['reference']} ({'total' if summary.get('batched') else 'median'} "
                  "tokens/s ratio)")
    ax.set_ylabel(f"accuracy, {grader} (%)")
    ax.set_title(f"{summary['problems']} problems")
    if ax.get_legend_handles_labels()[0]:  # an untimed accuracy run places no method
        ax.legend(fontsize=8)
    fig.tight_layout()
    first = run_dir / "accuracy_vs_speedup.png"
    fig.savefig(first, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["methods"].items():
        if m["acceptance_by_position"]:
            ax.plot(range(1, len(m["acceptance_by_position"]) + 1), m["acceptance_by_position"], marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    second = run_dir / "acceptance_by_position.png"
    fig.savefig(second, dpi=120)
    plt.close(fig)
    paired = [p for p in (_running_difference(summary, run_dir / "running_difference.png", plt),
                          _difference_vs_tau(summary, run_dir / "difference_vs_tau.png", plt)) if p]
    return [first, second, *paired]


def _difference_vs_tau(summary: dict, path: Path, plt) -> Path | None:
    """Per method that drafts, its paired accuracy difference against the reference (points, 95% interval) at its
    tau (tokens per target forward): how much a relaxed rule costs in accuracy for the acceptance it buys."""
    ref, grader = summary["reference"], summary["grader"]
    points = {name: (m["tau"], m["paired"][ref]["difference"]) for name, m in summary["methods"].items()
              if m.get("tau") and "difference" in m["paired"].get(ref, {})}
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, (tau, d) in sorted(points.items(), key=lambda item: item[1][0]):
        ax.errorbar(tau, 100 * d["difference"], yerr=[[100 * (d["difference"] - d["low"])],
                    [100 * (d["high"] - d["difference"])]], fmt="o", capsize=4, label=f"{name} (n={d['problems']})")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("tau (tokens per target forward)")
    ax.set_ylabel(f"accuracy vs {ref}, {grader} (points)")
    ax.set_title("paired difference, 95% interval")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _running_difference(summary: dict, path: Path, plt) -> Path | None:
    """Per method, the accuracy difference against the reference after each problem, with the fixed-n 95%
    interval one would read at that point (dashed) and the anytime-valid band (shaded): where an early lead
    that a fixed-n interval called real falls back inside the band, it was noise."""
    ref = summary["reference"]
    series = {name: m["paired"][ref]["difference"]["per_problem"] for name, m in summary["methods"].items()
              if "difference" in m["paired"].get(ref, {})}
    if not series:
        return None
    cols = min(len(series), 2)
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3 * rows), squeeze=False, sharey=True)
    for ax, (name, diffs) in zip(axes.flat, series.items()):
        n = range(1, len(diffs) + 1)
        band, fixed = confidence_path(diffs), normal_path(diffs)
        ax.fill_between(n, [100 * lo for lo, _ in band], [100 * hi for _, hi in band], alpha=0.2,
                        label="anytime 95%")
        ax.plot(n, [100 * m for m, _ in fixed], label="difference")
        ax.plot(n, [100 * (m - h) for m, h in fixed], "k--", linewidth=0.7, label="fixed-n 95%")
        ax.plot(n, [100 * (m + h) for m, h in fixed], "k--", linewidth=0.7)
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_ylim(-105, 105)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("problems")
    for ax in axes.flat[len(series):]:
        ax.axis("off")
    axes[0][0].set_ylabel(f"vs {ref}, points")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
