"""``--device``: the harness loads the models on it and names the device in every row's machine; what cannot
run there (the int8 draft is CPU-only) is refused before a model loads."""

from __future__ import annotations

import pytest
import torch

from evals.rows import read_rows
from evals.timing import Decoders, timed_method
from semverify.cli import main
from semverify.machine import cpu_name, machine
from tests.evals.test_compare import compare_args


def test_machine_names_the_gpu_or_the_processor(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert machine("cuda:0") == "NVIDIA H200 (CUDA)"
    assert machine(torch.device("cpu")) == machine() and machine().startswith(cpu_name())


def test_compare_on_the_cpu_device_writes_the_same_rows(tiny_checkpoint, tmp_path):
    assert main(compare_args(tiny_checkpoint, tmp_path / "run", limit=1, extra=["--device", "cpu", "--no-report"])) == 0
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 4 and {r["machine"] for r in rows} == {machine()}


def test_int8_drafts_are_refused_off_the_cpu_before_any_model_loads(tiny_checkpoint, tmp_path, monkeypatch):
    import evals.runner

    monkeypatch.setattr(evals.runner, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    args = compare_args(tiny_checkpoint, tmp_path / "run", limit=1, extra=["--device", "cuda"])
    args[args.index("--methods") + 1] = "vanilla,sd_int8"
    with pytest.raises(SystemExit, match="sd_int8 draft with the int8 model, which runs on the CPU only"):
        main(args)
    with pytest.raises(ValueError, match="sd_int8 draft with the int8 model"):
        Decoders(str(tiny_checkpoint), str(tiny_checkpoint), "float32", [timed_method("sd_int8")], device="cuda")
