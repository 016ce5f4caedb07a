"""Language-model backends used by prompted components: a local Hugging Face causal LM or any
OpenAI-compatible endpoint (vLLM, llama.cpp server, a hosted API).

Both expose the same two calls:
- ``chat(list_of_messages, max_new_tokens) -> list[str]`` (greedy decoding);
- ``yes_probability(list_of_messages) -> list[float]``: p("yes") / (p("yes") + p("no")) for the first
  answer token, the Qwen3-Reranker scoring rule.
"""

from __future__ import annotations

from ..errors import ConfigError

import hashlib
import json
import logging
import math
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class LLM(Protocol):
    name: str

    def chat(self, conversations: list[list[dict]], max_new_tokens: int = 256) -> list[str]: ...

    def yes_probability(self, conversations: list[list[dict]]) -> list[float]: ...


def resolve_dtype(dtype: str, device: str = "cpu"):
    """auto | auto_bf16 | bf16 | fp32 | fp16 -> a torch dtype ("auto" stays "auto": the checkpoint's own).

    auto_bf16 is bf16 where the hardware runs it natively (CUDA, or a CPU with AVX512-BF16/AMX; 1.5-2x
    faster than fp32 for SmolLM2 on such a CPU), else fp32.
    """
    import torch

    if dtype == "auto_bf16":
        native = torch.cuda.is_available() if device != "cpu" else torch.ops.mkldnn._is_mkldnn_bf16_supported()
        dtype = "bf16" if native else "fp32"
    table = {"auto": "auto", "bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"option llm.dtype must be auto, auto_bf16, bf16, fp32 or fp16, got {dtype!r}")
    return table[dtype]


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model")


def weights_id(path: str | Path | None) -> str:
    """The identity of a local model's weights, for cache keys: every weight and config file's name, size
    and modification time (a file rewritten in place changes it), hashed. A path that is not on disk (a hub
    id) is its own identity."""
    if path is None:
        return "none"
    p = Path(str(path))
    if not p.exists():
        return str(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p) if p.is_dir() else f.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return f"{p.name}:{h.hexdigest()[:16]}"


class HFCausalLM:
    """A local causal LM (any transformers checkpoint, or a model reference from arbor_train.modelref)."""

    def __init__(self, model: str, dtype: str = "auto", device: str = "cpu", batch_size: int = 8,
                 torch_threads: int | None = None, adapter: str | None = None, device_map: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..modelref import resolve

        if torch_threads:
            torch.set_num_threads(torch_threads)
        path = resolve(model)
        self.name = model
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = resolve_dtype(dtype, device)
        dtype = str(torch_dtype).replace("torch.", "")
        # what the outputs depend on (answer cache key): the weights themselves, not only their name
        self.cache_id = f"{model}|{weights_id(path)}|{dtype}|{adapter}|{weights_id(adapter)}"
        kwargs = {"dtype": torch_dtype}
        if device_map:  # accelerate places big models (empty-weight init, sharded over GPUs/CPU)
            kwargs["device_map"] = device_map
        self.model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if adapter:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, adapter)
        if not device_map:
            self.model.to(device)
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.batch_size = batch_size
        self._yes_no = yes_no_ids(self.tokenizer)

    @classmethod
    def from_parts(cls, model, tokenizer, name: str = "in-memory", batch_size: int = 8) -> "HFCausalLM":
        self = cls.__new__(cls)
        self.name, self.model, self.tokenizer, self.batch_size = name, model.eval(), tokenizer, batch_size
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = next(model.parameters()).device
        self._yes_no = yes_no_ids(tokenizer)
        return self

    @classmethod
    def from_bundle(cls, path: str, dtype: str = "auto", device: str = "cpu", batch_size: int = 8,
                    role: str = "reader") -> "HFCausalLM":
        """A tuned causal-LM bundle (role=reader: the answer model), merged in memory. Its cache id is the
        bundle's identity (training data fingerprint and export time), so a retrained bundle never
        reuses another's cached answers; `training_sessions` lists what it was trained on."""
        from .bundle import load_bundle

        b = load_bundle(path, role=role)
        model, tok = b.load_model(device=device)
        torch_dtype = resolve_dtype(dtype, device)
        self = cls.from_parts(model.to(torch_dtype), tok, name=f"bundle:{path}", batch_size=batch_size)
        self.cache_id = (f"bundle:{b.manifest['data_fingerprint']}|{b.manifest.get('created_at')}|"
                         f"{weights_id(b.path)}|{str(torch_dtype).replace('torch.', '')}")
        self.training_sessions = set(b.manifest.get("training_sessions") or [])
        return self

    def render(self, messages: list[dict]) -> str:
        from ..prompts import RERANK_SYSTEM

        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if messages and messages[0].get("content") == RERANK_SYSTEM and "<think>" in (self.tokenizer.chat_template or ""):
            text += "<think>\n\n</think>\n\n"
        return text

    def _batches(self, conversations: list[list[dict]]):
        """Rendered, left-padded batches of prompts on the model's device."""
        for i in range(0, len(conversations), self.batch_size):
            texts = [self.render(m) for m in conversations[i : i + self.batch_size]]
            yield self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False,
                                 return_token_type_ids=False).to(self.device)

    def chat(self, conversations: list[list[dict]], max_new_tokens: int = 256, by_length: bool = False,
             processor=None, prefix_kv=None) -> list[str]:
        """Greedy completions, in the order given. by_length: batch the prompts by length (little left
        padding: the extractors' ahead-of-commit batches); greedy decoding makes each completion
        independent of its batch-mates up to float rounding. Off by default, so batches stay as given.
        processor: a callable that returns a fresh logits processor for each generate() call (JSON-constrained
        decoding: runtime/constrain.py). prefix_kv: a `constrain.PrefixKV`; a prompt generated on its own
        starts from the stored keys and values of its longest stored prefix."""
        import torch
        from transformers import LogitsProcessorList

        order = list(range(len(conversations)))
        if by_length:
            order.sort(key=lambda i: len(self.render(conversations[i])))
        out: list[str] = [""] * len(conversations)
        k = 0
        for enc in self._batches([conversations[i] for i in order]):
            extra: dict = {}
            if processor is not None:
                extra["logits_processor"] = LogitsProcessorList([processor()])
            if prefix_kv is not None and enc["input_ids"].shape[0] == 1:
                cache = prefix_kv.cache_for(enc["input_ids"][0].tolist())
                if cache is not None:
                    extra["cache"] = cache  # transformers 5: generate's `cache` (was past_key_values)
            with torch.inference_mode():
                gen = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                          pad_token_id=self.tokenizer.pad_token_id, **extra)
            for row in gen[:, enc["input_ids"].shape[1] :]:
                out[order[k]] = self.tokenizer.decode(row, skip_special_tokens=True).strip()
                k += 1
        return out

    def yes_probability(self, conversations: list[list[dict]]) -> list[float]:
        import torch

        yes, no = self._yes_no
        out: list[float] = []
        for enc in self._batches(conversations):
            with torch.inference_mode():
                # only the last position's logits: the LM head over every position costs as much as the body
                logits = self.model(**enc, logits_to_keep=1).logits[:, -1, :]
            pair = torch.stack([logits[:, no], logits[:, yes]], dim=-1).float()
            out.extend(torch.softmax(pair, dim=-1)[:, 1].tolist())
        return out


def yes_no_ids(tokenizer) -> tuple[int, int]:
    def first(word: str) -> int:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if not ids:
            raise ValueError(f"tokenizer cannot encode {word!r}")
        return ids[0]

    return first("yes"), first("no")


class OpenAIEndpoint:
    """Any OpenAI-compatible chat endpoint (vLLM's `vllm serve`, llama.cpp server, hosted APIs)."""

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 max_retries: int = 2):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"answer/LLM option base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.cache_id = f"openai:{self.base_url}|{model}"  # another endpoint serving the same name is another model
        self.model = model
        self.api_key = os.environ.get(api_key_env, "EMPTY")
        self.timeout_s = timeout_s
        self.max_retries = max_retries

    def _post(self, payload: dict) -> dict:
        req = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        last: Exception | None = None
        for _ in range(self.max_retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    return json.loads(r.read())
            except (urllib.error.URLError, TimeoutError) as e:  # retried, then raised with the URL
                last = e
        raise ConnectionError(f"OpenAI-compatible endpoint {self.base_url} failed: {last}")

    def chat(self, conversations: list[list[dict]], max_new_tokens: int = 256) -> list[str]:
        out = []
        for messages in conversations:
            r = self._post({"model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                            "temperature": 0.0})
            out.append((r["choices"][0]["message"].get("content") or "").strip())
        return out

    def yes_probability(self, conversations: list[list[dict]]) -> list[float]:
        out = []
        for messages in conversations:
            r = self._post({"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0.0,
                            "logprobs": True, "top_logprobs": 10})
            choice = r["choices"][0]
            lp = {"yes": -math.inf, "no": -math.inf}
            content = ((choice.get("logprobs") or {}).get("content") or [])
            if content:
                for cand in content[0].get("top_logprobs", []):
                    tok = cand["token"].strip().lower()
                    if tok in lp and cand["logprob"] > lp[tok]:
                        lp[tok] = cand["logprob"]
            if lp["yes"] == -math.inf and lp["no"] == -math.inf:  # endpoint without logprobs: use the text
                text = (choice["message"].get("content") or "").strip().lower()
                out.append(1.0 if text.startswith("yes") else 0.0)
                continue
            m = max(lp.values())
            ey, en = math.exp(lp["yes"] - m), math.exp(lp["no"] - m)
            out.append(ey / (ey + en))
        return out


def build_llm(cfg) -> LLM:
    """Build a backend from a config mapping with `backend: hf|openai`."""
    cfg = dict(cfg)
    backend = cfg.pop("backend", "hf")
    if backend == "hf":
        return HFCausalLM(**cfg)
    if backend == "openai":
        return OpenAIEndpoint(**cfg)
    if backend == "bundle":
        return HFCausalLM.from_bundle(**cfg)
    raise ConfigError(f"LLM option backend must be 'hf', 'openai' or 'bundle', got {backend!r}")
