"""The router bundle: a self-describing folder that carries one tuned role into the runtime.

Layout (written by ``python -m arbor_train.export``, read here)::

    <bundle>/
      manifest.json      # required, see MANIFEST_FIELDS
      adapter/           # PEFT adapter: adapter_config.json + adapter_model.safetensors
                         #   (PeftModel.from_pretrained(base, "<bundle>/adapter") loads it)
      merged/            # optional: base + adapter merged, safetensors (serve with vLLM / plain HF)
      tokenizer/         # tokenizer files of the base model, as trained

manifest.json::

    {
      "format": "arbormem-bundle", "format_version": 1,
      "role": "reranker" | "extractor" | "tagger" | "reader",
      "kind": "cross_encoder" | "llm_scorer" | "causal_lm" | "encoder_multilabel" | "encoder_spans",
      "base_model": {"ref": "<model reference, see arbor_train.modelref>", "name": "<display name>"},
      "adapter": "adapter" | null, "merged": "merged" | null, "tokenizer": "tokenizer",
      "prompt_template": {"name": "...", "version": "1"},
      "max_length": 256,
      "labels": [...]            # tagger and span extractor: label order of the classification head
      "span_vocab": {...}        # span extractor: slot keys and tags, event verbs (runtime/spans.py)
      "kinds": [...]             # extractor only: which extraction kinds it writes
      "training_sessions": [...] # reader: content fingerprints of its training sessions; extractor and
                                 # reranker: the mixed-in conversation ids (eval.run refuses to score on them)
      "question_document": "state" | "text"  # reranker: what it reads of a question's candidate
      "metrics": {...}, "data_fingerprint": "sha256:...", "created_at": "ISO-8601",
      "arbor_train_version": "x.y.z", "git_commit": "..."
    }
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, unencodable
from ..prompts import EXTRACT_INSTRUCTIONS, KNOWN_TEMPLATES

FORMAT = "arbormem-bundle"
FORMAT_VERSION = 1
ROLE_KINDS = {
    "reranker": {"cross_encoder", "llm_scorer"},
    "extractor": {"causal_lm", "encoder_spans"},
    "tagger": {"encoder_multilabel", "causal_lm"},
    "reader": {"causal_lm"},
}
MANIFEST_FIELDS = {
    "format": str, "format_version": int, "role": str, "kind": str, "base_model": dict,
    "tokenizer": str, "prompt_template": dict, "metrics": dict, "data_fingerprint": str,
}


# optional fields: name -> (accepted types, what the error says)
OPTIONAL_FIELDS = {
    "adapter": ((str, type(None)), "a folder name or null"), "merged": ((str, type(None)), "a folder name or null"),
    "max_length": ((int,), "a positive integer"), "labels": ((list,), "a list of label strings"),
    "kinds": ((list,), "a list of extraction kinds"), "new_root_threshold": ((int, float), "a number in [0, 1]"),
    "baselines": ((dict,), "an object"), "created_at": ((str,), "a string"),
    "arbor_train_version": ((str,), "a string"), "git_commit": ((str,), "a string"),
    "training_run": ((str,), "a string"),
    "training_sessions": ((list,), "a list of session fingerprints"),
    "pair_head": ((dict,), "an object (the reranker's pair-feature head)"),
    "question_document": ((str,), "state or text (what the reranker reads of a question's candidate)"),
    "span_vocab": ((dict,), "an object (the span extractor's slot keys, tags and event verbs)"),
}


class BundleError(InputError):
    """A bundle the runtime cannot use: the message names the manifest file and the field."""


def _strings(mf: Path, value: Any, where: str = "") -> None:
    """Every string in the manifest (keys included) is valid UTF-8 text (no lone surrogates)."""
    if isinstance(value, str):
        if (e := unencodable(value)) is not None:
            raise BundleError(f"{mf}: field {where or 'manifest'!r} is not valid UTF-8 text ({e.reason})")
    elif isinstance(value, dict):
        for k, v in value.items():
            _strings(mf, k, where or "manifest")
            _strings(mf, v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _strings(mf, v, f"{where}[{i}]")


def _unique_strings(mf: Path, value: list, field: str, allowed: Any = None) -> None:
    seen: dict[str, int] = {}
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise BundleError(f"{mf}: field '{field}[{i}]' must be a non-empty string, got {v!r}")
        if allowed is not None and v not in allowed:
            raise BundleError(f"{mf}: field '{field}[{i}]' is {v!r}, expected one of {sorted(allowed)}")
        if v in seen:
            raise BundleError(f"{mf}: field {field!r} repeats {v!r} at positions {seen[v]} and {i}")
        seen[v] = i


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @property
    def role(self) -> str:
        return self.manifest["role"]

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def base_ref(self) -> str:
        return self.manifest["base_model"]["ref"]

    def sub(self, name: str | None) -> Path | None:
        return (self.path / name) if name else None

    def load_model(self, prefer: str = "merged", base_override: str | None = None, device: str = "cpu",
                   merge: bool = True):
        """Return (model, tokenizer) in eval mode: merged weights if present (and preferred), else base+adapter,
        merged in memory (`merge=True`: no LoRA matmuls per layer at inference; False keeps the PeftModel)."""
        from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification,
                                  AutoModelForTokenClassification, AutoTokenizer)

        from ..modelref import resolve

        tok = AutoTokenizer.from_pretrained(str(self.sub(self.manifest["tokenizer"])))
        causal = self.kind in {"llm_scorer", "causal_lm"}
        cls = (AutoModelForCausalLM if causal else AutoModelForTokenClassification if self.kind == "encoder_spans"
               else AutoModelForSequenceClassification)
        kwargs: dict[str, Any] = {}
        if not causal:
            labels = self.manifest.get("labels")
            kwargs["num_labels"] = len(labels) if labels else 1
            if self.kind == "encoder_multilabel":
                kwargs["problem_type"] = "multi_label_classification"
        merged = self.sub(self.manifest.get("merged"))
        if self.base_ref.startswith("inline:") and (merged is None or not merged.exists()):
            raise BundleError(f"bundle {self.path}: base {self.base_ref} was built in-process; merged/ is required")
        if merged is not None and prefer == "merged" and merged.exists():
            model = cls.from_pretrained(str(merged), **kwargs)
        else:
            adapter = self.sub(self.manifest.get("adapter"))
            if adapter is None or not adapter.exists():
                raise BundleError(f"bundle {self.path}: neither merged weights nor adapter/ present")
            from peft import PeftModel

            base = cls.from_pretrained(resolve(base_override or self.base_ref), **kwargs)
            if causal and len(tok) != base.get_input_embeddings().weight.shape[0]:
                base.resize_token_embeddings(len(tok))
            model = PeftModel.from_pretrained(base, str(adapter))
            if merge:
                model = model.merge_and_unload()
        return model.to(device).eval(), tok


def load_bundle(path: str | Path, role: str | None = None, base_model: str | None = None) -> Bundle:
    """Read and check a bundle's manifest; errors name the file and the field."""
    p = Path(path)
    mf = p / "manifest.json"
    if not mf.is_file():
        raise BundleError(f"bundle {p}: manifest.json not found")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BundleError(f"{mf}: invalid JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise BundleError(f"{mf}: not UTF-8 text ({e})") from e
    if not isinstance(manifest, dict):
        raise BundleError(f"{mf}: expected a JSON object, got {type(manifest).__name__}")
    for name, typ in MANIFEST_FIELDS.items():
        if name not in manifest:
            raise BundleError(f"{mf}: missing field {name!r}")
        if not isinstance(manifest[name], typ) or (typ is int and isinstance(manifest[name], bool)):
            raise BundleError(f"{mf}: field {name!r} must be {typ.__name__}, got {manifest[name]!r}")
    for name, (types, what) in OPTIONAL_FIELDS.items():
        v = manifest.get(name)
        if name in manifest and (not isinstance(v, types) or isinstance(v, bool)):
            raise BundleError(f"{mf}: field {name!r} must be {what}, got {v!r}")
    _strings(mf, manifest)
    if manifest.get("question_document", "state") not in ("state", "text"):
        raise BundleError(f"{mf}: field 'question_document' must be state or text, got {manifest['question_document']!r}")
    if manifest["format"] != FORMAT or manifest["format_version"] != FORMAT_VERSION:
        raise BundleError(f"{mf}: format {manifest['format']!r} v{manifest['format_version']} is not {FORMAT} v{FORMAT_VERSION}")
    if manifest["role"] not in ROLE_KINDS:
        raise BundleError(f"{mf}: field 'role' is {manifest['role']!r}, expected one of {sorted(ROLE_KINDS)}")
    if manifest["kind"] not in ROLE_KINDS[manifest["role"]]:
        raise BundleError(f"{mf}: field 'kind' {manifest['kind']!r} is not a {manifest['role']} kind {sorted(ROLE_KINDS[manifest['role']])}")
    if role is not None and manifest["role"] != role:
        raise BundleError(f"{mf}: bundle role is {manifest['role']!r} but it was configured as the {role}")
    if "ref" not in manifest["base_model"]:
        raise BundleError(f"{mf}: field 'base_model.ref' missing")
    if not isinstance(manifest["base_model"]["ref"], str) or not manifest["base_model"]["ref"]:
        raise BundleError(f"{mf}: field 'base_model.ref' must be a non-empty string, got "
                          f"{manifest['base_model']['ref']!r}")
    if manifest.get("max_length") is not None and manifest["max_length"] < 1:
        raise BundleError(f"{mf}: field 'max_length' must be a positive integer, got {manifest['max_length']}")
    thr = manifest.get("new_root_threshold")
    if thr is not None and not 0 <= thr <= 1:
        raise BundleError(f"{mf}: field 'new_root_threshold' must be a number in [0, 1], got {thr}")
    if "labels" in manifest:
        _unique_strings(mf, manifest["labels"], "labels")
    if "kinds" in manifest:  # extraction kinds: those arbor_train/prompts.py has an instruction for
        _unique_strings(mf, manifest["kinds"], "kinds", allowed=EXTRACT_INSTRUCTIONS)
    if base_model is not None and manifest["base_model"]["ref"] != base_model:
        raise BundleError(f"{mf}: base_model.ref is {manifest['base_model']['ref']!r}, expected {base_model!r}")
    tmpl = manifest["prompt_template"]
    if not isinstance(tmpl.get("name"), str) or not isinstance(tmpl.get("version"), str):
        raise BundleError(f"{mf}: field 'prompt_template' must be {{\"name\": str, \"version\": str}}, got {tmpl}")
    if KNOWN_TEMPLATES.get(tmpl.get("name")) != tmpl.get("version"):
        raise BundleError(f"{mf}: prompt_template {tmpl} is unknown to this runtime (known: {KNOWN_TEMPLATES})")
    root = p.resolve()
    for field in ("tokenizer", "adapter", "merged"):  # a manifest names folders of its own bundle, nothing else
        sub = manifest.get(field)
        if isinstance(sub, str) and (not sub or Path(sub).is_absolute() or not (root / sub).resolve().is_relative_to(root)):
            raise BundleError(f"{mf}: field {field!r} is {sub!r}, which is not a folder inside the bundle "
                              f"(a bundle's files resolve inside {p}, links included)")
    if not manifest.get("adapter") and not manifest.get("merged"):
        raise BundleError(f"{mf}: one of 'adapter' or 'merged' must name a folder")
    if manifest["role"] == "tagger" and manifest["kind"] == "encoder_multilabel" and not manifest.get("labels"):
        raise BundleError(f"{mf}: tagger bundles need 'labels'")
    if manifest["kind"] == "encoder_spans":
        if not manifest.get("labels") or not isinstance(manifest.get("span_vocab"), dict):
            raise BundleError(f"{mf}: encoder_spans bundles need 'labels' and 'span_vocab'")
        from .spans import SpanCodec

        try:
            SpanCodec(manifest["labels"], manifest["span_vocab"])
        except ValueError as e:
            raise BundleError(f"{mf}: field 'labels': {e}") from e
    return Bundle(p, manifest)


def write_manifest(path: str | Path, manifest: dict[str, Any]) -> Path:
    """Write manifest.json after checking it with the same rules the loader applies."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
    (p / "manifest.json").write_text(json.dumps(full, indent=2, sort_keys=True))
    load_bundle(p)
    return p / "manifest.json"
