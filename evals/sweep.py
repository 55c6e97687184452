"""Thresholds chosen by accuracy: one method over a grid of its knobs, run as one compare (the same problems
and seeds for every setting and for the references), drawn as accuracy against speedup, with the fastest
setting that keeps a given share of the reference's accuracy."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from .summary import summarise


def grid_methods(method: str, grids: dict[str, list]) -> list[str]:
    """``method:key=value,...`` for every combination of the grid values, in grid order."""
    keys = list(grids)
    return [f"{method}:" + ",".join(f"{k}={v}" for k, v in zip(keys, values))
            for values in itertools.product(*(grids[k] for k in keys))]


def parse_grid(texts: list[str]) -> dict[str, list]:
    """``["key=v1,v2", ...]`` -> {key: [v1, v2]} with the values as typed (int, float, bool or str)."""
    from semverify.registry import parse_param

    grids = {}
    for text in texts:
        key, sep, values = text.partition("=")
        if not sep or not values.strip():
            raise ValueError(f"--grid takes KEY=V1,V2,..., got {text!r}")
        grids[key.strip()] = [parse_param(f"{key}={v}")[1] for v in values.split(",") if v.strip()]
    return grids


def frontier(run_dir: str | Path, settings: list[str], reference: str, keep: float,
             grader: str | None = None) -> dict:
    """Accuracy, speedup and tau of every setting against ``reference``, and the pick: the fastest setting
    whose accuracy is at least ``keep`` x the reference's (None when no setting keeps it)."""
    summary = summarise(run_dir, reference, grader, [reference])
    grader = summary["grader"]
    ref_acc = summary["methods"][reference]["accuracy"][grader]["acc"]
    rows = []
    for name, m in summary["methods"].items():
        acc = m["accuracy"][grader]
        step = m["scores"].get("step_accepted")
        rows.append({"method": name, "setting": name in settings, "accuracy": acc["acc"], "correct": acc["correct"],
                     "ci95": acc["ci95"], "speedup": m["speedup"], "tau": m["tau"],
                     "step_acceptance": step["ones"] / step["n"] if step else None,
                     "p_vs_reference": m["paired"].get(reference, {}).get("p_value")})
    kept = [r for r in rows if r["setting"] and r["accuracy"] >= keep * ref_acc]
    pick = max(kept, key=lambda r: r["speedup"])["method"] if kept else None
    return {"problems": summary["problems"], "reference": reference, "keep": keep, "reference_accuracy": ref_acc,
            "grader": grader, "rows": rows, "pick": pick}


def markdown(result: dict) -> str:
    lines = [f"# Sweep over {result['problems']} problems: keep {100 * result['keep']:.0f}% of "
             f"`{result['reference']}`'s {result['grader']} accuracy ({100 * result['reference_accuracy']:.1f}%)", "",
             "| method | accuracy [95% CI] | speedup (median) | tau | steps accepted | p vs reference |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        steps = f"{100 * r['step_acceptance']:.0f}%" if r["step_acceptance"] is not None else "-"
        p = f"{r['p_vs_reference']:.3f}" if r["p_vs_reference"] is not None else "-"
        lines.append(f"| {r['method']} | {r['correct']}/{result['problems']} [{100 * r['ci95'][0]:.0f}, "
                     f"{100 * r['ci95'][1]:.0f}] | {r['speedup']:.2f}x | {r['tau']:.2f} | {steps} | {p} |")
    pick = f"`{result['pick']}`" if result["pick"] else "none of the settings"
    lines += ["", f"Pick: {pick} (the fastest setting at or above {100 * result['keep']:.0f}% of the reference's "
                  "accuracy on these problems)."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in result["rows"]:
        marker = "o" if r["setting"] else "s"
        ax.errorbar(r["speedup"], 100 * r["accuracy"], fmt=marker, capsize=3,
                    yerr=[[100 * (r["accuracy"] - r["ci95"][0])], [100 * (r["ci95"][1] - r["accuracy"])]])
        ax.annotate(r["method"].split(":", 1)[-1], (r["speedup"], 100 * r["accuracy"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.axhline(100 * result["keep"] * result["reference_accuracy"], linestyle="--", linewidth=0.8, color="gray")
    ax.set_xlabel(f"speedup vs {result['reference']} (tokens/s ratio, as in the run's report)")
    ax.set_ylabel(f"accuracy, {result['grader']} (%)")
    ax.set_title(f"{result['problems']} problems; dashed: {100 * result['keep']:.0f}% of {result['reference']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(result: dict, run_dir: str | Path) -> str:
    run_dir = Path(run_dir)
    (run_dir / "sweep.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (run_dir / "sweep.md").write_text(text)
    plot(result, run_dir / "sweep.png")
    return text
