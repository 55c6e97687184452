"""Session fixtures: the real packaged models (loaded once) and a tiny local checkpoint."""

from __future__ import annotations

import os

import pytest
import torch

from .helpers import save_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def qwen_pair():
    """The default real pair in fp32 (exact comparisons), loaded once per session."""
    from semverify.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_model

    target, tokenizer = load_model(DEFAULT_TARGET, dtype="float32")
    draft, _ = load_model(DEFAULT_DRAFT, dtype="float32")
    yield target, draft, tokenizer
    del target, draft


@pytest.fixture(scope="session")
def smollm():
    from semverify.models import load_model

    return load_model("smollm2-135m-instruct", dtype="float32")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A local folder (tiny random llama + byte tokenizer) that load_model reads like any checkpoint."""
    return save_checkpoint(tmp_path_factory.mktemp("tiny-checkpoint"))
