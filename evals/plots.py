"""The plots of a run's report: accuracy against speedup (with intervals) and acceptance by draft position."""

from __future__ import annotations

from pathlib import Path


def plot(summary: dict, run_dir: Path) -> list[Path]:
    """accuracy_vs_speedup.png (with intervals) and acceptance_by_position.png."""
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
    return [first, second]
