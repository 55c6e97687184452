"""The examples run as documented (on a tiny checkpoint, so CI checks they do not rot)."""

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_rules_side_by_side_runs_and_skips_rules_without_their_files(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))  # no calibrations or probes for the tiny model
    main = runpy.run_path(str(EXAMPLES / "rules_side_by_side.py"))["main"]
    main(["--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--max-new-tokens", "6",
          "--dtype", "float32", "--do-sample"])
    out = capsys.readouterr().out
    for rule in ("target alone", "speculative", "typical", "step_likelihood", "specreason"):
        assert f"=== {rule}: math-verify" in out
    assert "[skipping easd: no entropy calibration" in out and "[skipping semanticspec: no semantic probe" in out
