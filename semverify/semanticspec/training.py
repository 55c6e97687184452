"""From sampled steps to a matched pair of probes: meaning labels, training, held-out figures.

Every step sampled at a prefix (the target's and the draft's together) is clustered by meaning. A step's
target label is the share of the target's own samples in its cluster (0 when the target never wrote
that meaning), its draft label the share of the draft's. The target probe learns the target label
from the target's states over both models' steps; the draft probe learns the draft label from the
draft's states over its own steps. Both are fit on one split by prefix and carry the same ``pair`` id:
their ratio is only meaningful for probes labelled on the same steps, and the rule refuses others.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .judges import Judge
from .probe import SemanticProbe

R_MIN_GRID = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
MEAN_LOGPROB_GRID = (-0.05, -0.1, -0.2, -0.3, -0.5, -0.8)  # step_likelihood's min_mean_logprob


def label_samples(work: str | os.PathLike, judge: Judge, progress: bool = True) -> dict:
    """Cluster the samples of every prefix under ``work/samples`` and gather what training needs.

    Returns tensors: ``target_x``/``target_y``/``target_group``/``target_is_draft`` (target probe rows: all
    steps), ``draft_x``/``draft_y``/``draft_group`` (draft probe rows: the draft's steps, in the same order
    as the draft rows of the target set), ``draft_label_t`` (the target label of each draft step) and
    ``draft_stats`` (the target's token statistics per draft step, see `labelling.STATS`).
    """
    files = sorted((Path(work) / "samples").glob("*.pt"))
    if not files:
        raise FileNotFoundError(f"no samples under {work}/samples; run `semverify probes` to draw them first")
    cols: dict[str, list] = {k: [] for k in ("target_x", "target_y", "target_group", "target_is_draft", "draft_x",
                                               "draft_y", "draft_group", "draft_label_t", "draft_stats")}
    for g, path in enumerate(tqdm(files, desc="label", unit="prefix", disable=not progress)):
        data = torch.load(path, weights_only=True)
        own, drafted = data["target"], data["draft"]
        n_t, n_d = len(own["text"]), len(drafted["text"])
        clusters = judge(own["text"] + drafted["text"], data["prefix_text"])
        share_t = [sum(c == x for x in clusters[:n_t]) / n_t for c in clusters]
        share_d = [sum(c == x for x in clusters[n_t:]) / n_d for c in clusters]
        cols["target_x"] += [own["tokens_mean"], drafted["tokens_mean"]]
        cols["target_y"] += share_t
        cols["target_group"] += [g] * (n_t + n_d)
        cols["target_is_draft"] += [False] * n_t + [True] * n_d
        cols["draft_x"].append(drafted["emitting"])
        cols["draft_y"] += share_d[n_t:]
        cols["draft_group"] += [g] * n_d
        cols["draft_label_t"] += share_t[n_t:]
        cols["draft_stats"] += list(drafted["stats"])
    out = {k: torch.cat(v).float() if k.endswith("_x") else torch.tensor(v) for k, v in cols.items()
           if k != "draft_stats"}
    out["draft_stats"] = cols["draft_stats"]
    out["prefixes"] = len(files)
    return out


def split_groups(groups: torch.Tensor, seed: int = 42) -> dict[str, torch.Tensor]:
    """70/20/10 train/val/test split of the prefix ids in ``groups`` (no prefix in two splits)."""
    ids = torch.unique(groups)
    order = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))]
    n_train, n_val = max(1, int(0.7 * len(order))), max(1, int(0.2 * len(order)))
    parts = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
    if not len(parts["test"]):
        parts["test"] = parts["val"]
    return parts


def auroc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for ``positive`` (bool) rows, ties counted half; nan if one
    class is empty. The Mann-Whitney form: P(score of a positive > score of a negative)."""
    pos, neg = scores[positive].float(), scores[~positive].float()
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).float().mean()
    ties = (pos[:, None] == neg[None, :]).float().mean()
    return float(greater + 0.5 * ties)


def regression_metrics(pred: torch.Tensor, y: torch.Tensor) -> dict:
    """MSE, MAE, R^2, the base rates (mean label, mean prediction) and the AUROC with which the prediction
    separates steps the model would never write (label 0) from the rest (higher score = label > 0)."""
    mse = float(((pred - y) ** 2).mean())
    var = float(((y - y.mean()) ** 2).mean())
    return {"n": int(len(y)), "mse": mse, "mae": float((pred - y).abs().mean()),
            "r2": 1 - mse / var if var > 0 else float("nan"), "label_mean": float(y.mean()),
            "pred_mean": float(pred.mean()), "label0_share": float((y == 0).float().mean()),
            "auroc_label0": auroc(pred, y > 0)}


def fit_probe(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, val: torch.Tensor, width: int = 512,
              epochs: int = 100, patience: int = 10, lr: float = 1e-3, batch_size: int = 64, seed: int = 42,
              model_name: str = "") -> SemanticProbe:
    """MSE training (Adam) with early stopping on the validation rows; the best-validation weights."""
    torch.manual_seed(seed)
    probe = SemanticProbe(x.shape[1], width=width, model=model_name)
    opt = torch.optim.Adam(probe.parameters(), lr=lr)
    x_tr, y_tr = x[train], y[train]
    best, best_state, stale = math.inf, None, 0
    for _ in range(epochs):
        probe.train()
        perm = torch.randperm(len(x_tr))
        for i in range(0, len(perm), batch_size):
            b = perm[i : i + batch_size]
            loss = torch.nn.functional.mse_loss(probe(x_tr[b]), y_tr[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        probe.eval()
        with torch.no_grad():
            val_mse = float(((probe(x[val]) - y[val]) ** 2).mean())
        if val_mse < best - 1e-6:
            best, best_state, stale = val_mse, {k: v.clone() for k, v in probe.state_dict().items()}, 0
        else:
            stale += 1
            if stale >= patience:
                break
    probe.load_state_dict(best_state)
    return probe.eval()


def step_signals(data: dict, rows: torch.Tensor, p_t: torch.Tensor, p_d: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per draft step (``rows`` of the draft set), the scores a step rule could threshold: the probe ratio,
    P_t alone, and the target's own likelihood of the step (mean and minimum warped token log-probability,
    the highest rank of a step token)."""
    stats = [data["draft_stats"][int(i)].float() for i in rows]
    return {"probe_ratio": p_t / p_d.clamp_min(1e-6), "probe_target": p_t,
            "mean_logp": torch.tensor([s[:, 1].mean() for s in stats]),
            "min_logp": torch.tensor([s[:, 1].min() for s in stats]),
            "neg_max_rank": torch.tensor([-s[:, 2].max() for s in stats])}


def train_pair(data: dict, draft_model: str, target_model: str, width: int = 512, seed: int = 42,
               **fit) -> tuple[SemanticProbe, SemanticProbe, dict]:
    """Fit the draft and the target probe on one split by prefix; returns both and a report with held-out
    regression figures, base rates, and how well each step signal tells label-0 draft steps apart."""
    parts = split_groups(data["target_group"], seed)
    t_mask = {k: torch.isin(data["target_group"], v) for k, v in parts.items()}
    d_mask = {k: torch.isin(data["draft_group"], v) for k, v in parts.items()}
    target = fit_probe(data["target_x"], data["target_y"], t_mask["train"], t_mask["val"], width, seed=seed,
                       model_name=target_model, **fit)
    draft = fit_probe(data["draft_x"], data["draft_y"], d_mask["train"], d_mask["val"], width, seed=seed,
                      model_name=draft_model, **fit)
    with torch.no_grad():
        pred_t, pred_d = target(data["target_x"]), draft(data["draft_x"])
    on_draft = data["target_is_draft"]
    report = {"prefixes": int(data["prefixes"]), "splits": {k: int(len(v)) for k, v in parts.items()},
              "target": {k: regression_metrics(pred_t[m], data["target_y"][m]) for k, m in t_mask.items()},
              "target_on_draft_steps": {k: regression_metrics(pred_t[m & on_draft], data["target_y"][m & on_draft])
                                        for k, m in t_mask.items()},
              "draft": {k: regression_metrics(pred_d[m], data["draft_y"][m]) for k, m in d_mask.items()}}
    test = d_mask["test"].nonzero().flatten()
    label_t = data["draft_label_t"][test]
    signals = step_signals(data, test, pred_t[on_draft][test], pred_d[test])
    report["test_draft_steps"] = {
        "n": int(len(test)), "label0_share": float((label_t == 0).float().mean()),
        "auroc_label0": {name: auroc(s, label_t > 0) for name, s in signals.items()},
        "ratio_rule": [_ratio_rule(signals["probe_ratio"], label_t, r_min) for r_min in R_MIN_GRID],
    }
    pair = hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:16]
    roles = ((draft, "draft", report["draft"]), (target, "target", report["target_on_draft_steps"]))
    for probe, role, metrics in roles:
        probe.meta.update({"role": role, "pair": pair, "base_rate": metrics["train"]["label_mean"],
                           "metrics": metrics, "feature": "emitting" if role == "draft" else "tokens"})
    report["pair"] = pair
    return draft, target, report


def cross_validate(data: dict, folds: int = 5, width: int = 512, seed: int = 42, resamples: int = 1000,
                   **fit) -> dict:
    """Out-of-fold figures for every draft step: prefixes are cut into ``folds`` parts, each part is scored
    by a pair fit on the others (15% of those for early stopping), and the pooled predictions give the
    probes' R^2 and each step signal's AUROC for label-0 steps, with a 95% interval from resampling
    prefixes. Small data has a test split too small to tell signals apart; this uses every step."""
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    groups = torch.unique(data["draft_group"])
    order = groups[torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed))]
    if len(order) < 2 * folds:
        raise ValueError(f"{len(order)} prefixes are too few for {folds}-fold cross-validation (each fold "
                         "needs 2); draw more, or use fewer folds")
    on_draft = data["target_is_draft"]
    x_t, y_t = data["target_x"][on_draft], data["target_y"][on_draft]
    p_t, p_d = torch.empty(len(x_t)), torch.empty(len(data["draft_x"]))
    for f in range(folds):
        held = order[f::folds]
        rest = order[~torch.isin(order, held)]
        n_val = max(1, int(0.15 * len(rest)))
        val, train = rest[:n_val], rest[n_val:]
        t_rows, d_rows = data["target_group"], data["draft_group"]
        target = fit_probe(data["target_x"], data["target_y"], torch.isin(t_rows, train), torch.isin(t_rows, val),
                           width, seed=seed, **fit)
        draft = fit_probe(data["draft_x"], data["draft_y"], torch.isin(d_rows, train), torch.isin(d_rows, val),
                          width, seed=seed, **fit)
        out = torch.isin(d_rows, held)
        with torch.no_grad():
            p_t[out], p_d[out] = target(x_t[out]), draft(data["draft_x"][out])
    rows = torch.arange(len(p_d))
    signals = step_signals(data, rows, p_t, p_d)
    label_t, groups_of = data["draft_label_t"], data["draft_group"]
    gen = torch.Generator().manual_seed(seed)
    draws = [torch.randint(len(groups), (len(groups),), generator=gen) for _ in range(resamples)]
    member = [torch.cat([(groups_of == groups[i]).nonzero().flatten() for i in d]) for d in draws]

    def interval(score: torch.Tensor) -> list[float]:
        values = torch.tensor([auroc(score[m], label_t[m] > 0) for m in member])
        values = values[~values.isnan()]
        return [float(values.quantile(0.025)), float(values.quantile(0.975))] if len(values) else [math.nan] * 2

    return {"folds": folds, "prefixes": int(len(groups)), "n": int(len(rows)),
            "label0_share": float((label_t == 0).float().mean()),
            "target_on_draft_steps": regression_metrics(p_t, y_t), "draft": regression_metrics(p_d, data["draft_y"]),
            "auroc_label0": {name: {"auroc": auroc(sig, label_t > 0), "ci95": interval(sig)}
                             for name, sig in signals.items()},
            "ratio_rule": [_ratio_rule(signals["probe_ratio"], label_t, r_min) for r_min in R_MIN_GRID],
            "likelihood_rule": [_likelihood_rule(signals["mean_logp"], label_t, t) for t in MEAN_LOGPROB_GRID]}


SIGNALS = {"probe_ratio": "probe ratio P_t/P_d", "probe_target": "P_t alone",
           "mean_logp": "target mean log-prob of the step", "min_logp": "target min token log-prob",
           "neg_max_rank": "minus the worst token rank"}


def report_markdown(report: dict) -> str:
    """The probe report as Markdown: held-out regression figures, base rates, and the step signals."""
    lines = [f"# Probe pair {report['pair']}: {report['prefixes']} prefixes", ""]
    if report.get("command"):
        lines += [f"`{report['command']}`", ""]
    lines += ["| probe | rows (test) | R^2 | MSE | MAE | base rate: label | prediction | label-0 share "
              "| AUROC label 0 |", "|---|---|---|---|---|---|---|---|---|"]
    for name, key in (("target (on draft steps)", "target_on_draft_steps"), ("target (all steps)", "target"),
                      ("draft", "draft")):
        m = report[key]["test"]
        lines.append(f"| {name} | {m['n']} | {m['r2']:.3f} | {m['mse']:.4f} | {m['mae']:.3f} | {m['label_mean']:.3f} | "
                     f"{m['pred_mean']:.3f} | {m['label0_share']:.3f} | {m['auroc_label0']:.3f} |")
    cv = report.get("cross_validated")
    if cv:
        lines += ["", f"Out of fold ({cv['folds']}-fold by prefix, all {cv['n']} draft steps, "
                      f"{100 * cv['label0_share']:.1f}% of them never written by the target): target probe R^2 "
                      f"{cv['target_on_draft_steps']['r2']:.3f}, draft probe R^2 {cv['draft']['r2']:.3f}.", "",
                  "| signal for 'the target would never write this step' | AUROC [95% CI, prefixes resampled] |",
                  "|---|---|"]
        for name, a in cv["auroc_label0"].items():
            lines.append(f"| {SIGNALS.get(name, name)} | {a['auroc']:.3f} [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}] |")
        lines += ["", "| r_min | steps accepted (expected) | accepted steps the target never writes |", "|---|---|---|"]
        for r in cv["ratio_rule"]:
            bad = 100 * r["label0_share_of_accepted"]
            lines.append(f"| {r['r_min']} | {100 * r['accept_share']:.1f}% | {bad:.1f}% |")
        lines += ["", "| step_likelihood min_mean_logprob | steps accepted | accepted steps the target never writes |",
                  "|---|---|---|"]
        for r in cv["likelihood_rule"]:
            bad = 100 * r["label0_share_of_accepted"]
            lines.append(f"| {r['min_mean_logprob']} | {100 * r['accept_share']:.1f}% | {bad:.1f}% |")
    return "\n".join(lines) + "\n"


def _likelihood_rule(mean_logp: torch.Tensor, label_t: torch.Tensor, threshold: float) -> dict:
    """step_likelihood's test on draft steps: the share accepted and the share of those the target never writes."""
    accepted = mean_logp >= threshold
    n = int(accepted.sum())
    return {"min_mean_logprob": threshold, "accept_share": n / max(len(mean_logp), 1),
            "label0_share_of_accepted": float((label_t[accepted] == 0).float().mean()) if n else float("nan")}


def _ratio_rule(ratio: torch.Tensor, label_t: torch.Tensor, r_min: float) -> dict:
    """SemanticSpec's test on held-out draft steps: expected share accepted (r >= r_min, then with
    probability min(1, r)) and the share of accepted steps the target would never write."""
    p_accept = torch.where(ratio >= r_min, ratio.clamp(max=1.0), torch.zeros_like(ratio))
    accepted = float(p_accept.sum())
    bad = float((p_accept * (label_t == 0).float()).sum())
    return {"r_min": r_min, "accept_share": accepted / max(len(ratio), 1),
            "label0_share_of_accepted": bad / accepted if accepted else float("nan")}
