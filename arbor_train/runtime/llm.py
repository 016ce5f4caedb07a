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
    """Any OpenAI-compatible chat endpoint (vLLM's `vllm serve`, llama.cpp server, `python -m arbor_train.serve`,
    hosted APIs).

    Each request has a timeout (`timeout_s`) and is retried `max_retries` times with exponential backoff
    on a connection error, a timeout, 408, 429 or a 5xx answer; another 4xx answer is the request's fault
    and fails at once, with the endpoint's message. A list of prompts runs up to `concurrency` requests at
    a time. `usage` counts requests and the prompt and completion tokens the endpoint reported."""

    RETRY_STATUS = (408, 429, 500, 502, 503, 504)

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 max_retries: int = 2, concurrency: int = 1, backoff_s: float = 0.5):
        import threading
        from collections import Counter

        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"answer/LLM option base_url must start with http:// or https://, got {base_url!r}")
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"LLM option concurrency must be an integer of at least 1, got {concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.cache_id = f"openai:{self.base_url}|{model}"  # another endpoint serving the same name is another model
        self.model = model
        self.api_key = os.environ.get(api_key_env, "EMPTY")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.usage: Counter = Counter({"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "retries": 0})
        self._lock = threading.Lock()

    def usage_snapshot(self) -> dict:
        """A copy of `usage`, taken under the lock the request threads write it with."""
        with self._lock:
            return dict(self.usage)

    def identity(self) -> str:
        """What the endpoint says it serves under this model name (`GET /models`: the entry's `root`, the
        checkpoint behind the name, as vLLM and arbor_train.serve report it; "" where it says nothing). A
        teacher-call cache records it, so that another checkpoint served under the same name is noticed."""
        req = urllib.request.Request(self.base_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                data = json.loads(r.read()).get("data") or []
        except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError, AttributeError) as e:
            raise ConnectionError(f"OpenAI-compatible endpoint {self.base_url} did not list its models: {e}") from None
        entry = next((m for m in data if isinstance(m, dict) and m.get("id") == self.model), None)
        if entry is None:
            served = [m.get("id") for m in data if isinstance(m, dict)]
            raise ConnectionError(f"OpenAI-compatible endpoint {self.base_url} does not serve model {self.model!r} "
                                  f"(it serves {served})")
        return str(entry.get("root") or "")

    def _post(self, payload: dict) -> dict:
        import time

        req = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    out = json.loads(r.read())
                u = out.get("usage") or {}
                with self._lock:
                    self.usage["requests"] += 1
                    self.usage["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
                    self.usage["completion_tokens"] += int(u.get("completion_tokens") or 0)
                return out
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", "replace")
                if e.code not in self.RETRY_STATUS:  # the request's own fault: retrying cannot help
                    raise ConnectionError(f"OpenAI-compatible endpoint {self.base_url} refused the request "
                                          f"(HTTP {e.code}): {detail}") from None
                last = e
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
                last = e  # retried, then raised with the URL
            with self._lock:
                self.usage["retries"] += attempt < self.max_retries
        raise ConnectionError(f"OpenAI-compatible endpoint {self.base_url} failed after {self.max_retries + 1} "
                              f"tries: {last}")

    def _map(self, fn, items: list) -> list:
        if self.concurrency == 1 or len(items) < 2:
            return [fn(x) for x in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(self.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    json_schemas = True  # chat(json_schema=...): the endpoint constrains the output (OpenAI `response_format`)

    def chat(self, conversations: list[list[dict]], max_new_tokens: int = 256,
             json_schema: dict | None = None) -> list[str]:
        """Greedy completions. json_schema: the output must follow it, sent as OpenAI's structured-output
        `response_format` (`{"type": "json_schema", ...}`), which vLLM and arbor_train.serve enforce while
        decoding."""
        extra = {} if json_schema is None else {"response_format": {
            "type": "json_schema", "json_schema": {"name": "output", "schema": json_schema}}}

        def one(messages):
            r = self._post({"model": self.model, "messages": messages, "max_tokens": max_new_tokens,
                            "temperature": 0.0, **extra})
            return (r["choices"][0]["message"].get("content") or "").strip()

        return self._map(one, conversations)

    def yes_probability(self, conversations: list[list[dict]]) -> list[float]:
        return self._map(self._yes_one, conversations)

    def _yes_one(self, messages: list[dict]) -> float:
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
            return 1.0 if text.startswith("yes") else 0.0
        m = max(lp.values())
        ey, en = math.exp(lp["yes"] - m), math.exp(lp["no"] - m)
        return ey / (ey + en)


class RecordedLLM:
    """A backend whose every call goes through a disk cache (data_gen.distill's teacher).

    A call is keyed by the backend's identity (`cache_id`), the method, the generation length and the exact
    messages (kvcache.cache_key), and its answer is written to SQLite as soon as it returns, so a killed
    run that is started again repeats no call it had finished. Prompts an endpoint answers one at a time
    run `concurrency` at a time (a bounded pool); a local model gets its own batches. `stats` counts the
    calls made (`calls`), the ones answered from the cache (`cached`) and, of those, the ones an earlier
    run made (`reused`: keys not in `written`, the set of keys this run wrote, shared by the wrappers of
    one run), and the wall seconds spent waiting for calls made (`call_s`); `requested` (shared too) gathers
    every distinct call asked for, `reused_keys` every distinct one an earlier run had made (its size is the
    number of calls reused). `on_call()` runs after each call (a progress bar)."""

    def __init__(self, llm, cache, stats, concurrency: int = 1, on_call=None, written: set | None = None,
                 requested: set | None = None, reused_keys: set | None = None):
        self.llm, self.cache, self.stats = llm, cache, stats
        self.written = set() if written is None else written
        self.requested = set() if requested is None else requested
        self.reused_keys = set() if reused_keys is None else reused_keys
        self.name = llm.name
        self.cache_id = getattr(llm, "cache_id", None) or llm.name
        self.concurrency = concurrency
        self.on_call = on_call
        self.tokenizer = getattr(llm, "tokenizer", None)

    @property
    def json_schemas(self) -> bool:
        return bool(getattr(self.llm, "json_schemas", False))

    def chat(self, conversations: list[list[dict]], max_new_tokens: int = 256,
             json_schema: dict | None = None) -> list[str]:
        if json_schema is None:
            return self._calls("chat", conversations, max_new_tokens, lambda ms: self.llm.chat(ms, max_new_tokens))
        # a constrained call is another call: the schema is part of its key
        method = "chat:json:" + hashlib.sha1(json.dumps(json_schema, sort_keys=True).encode()).hexdigest()[:16]
        return self._calls(method, conversations, max_new_tokens,
                           lambda ms: self.llm.chat(ms, max_new_tokens, json_schema=json_schema))

    def yes_probability(self, conversations: list[list[dict]]) -> list[float]:
        return self._calls("yes", conversations, 1, self.llm.yes_probability)

    def _count_local(self, msgs: list[list[dict]], outs: list) -> None:
        """Tokens of a local model's calls (an endpoint reports its own: OpenAIEndpoint.usage)."""
        if self.tokenizer is None or isinstance(self.llm, OpenAIEndpoint):
            return
        for m, o in zip(msgs, outs):
            self.stats["prompt_tokens"] += len(self.tokenizer(self.llm.render(m), add_special_tokens=False)["input_ids"])
            if isinstance(o, str):
                self.stats["completion_tokens"] += len(self.tokenizer(o, add_special_tokens=False)["input_ids"])
            else:
                self.stats["completion_tokens"] += 1

    def _calls(self, method: str, conversations: list[list[dict]], n: int, fn) -> list:
        from .kvcache import cache_key

        import time

        keys = [cache_key(self.cache_id, method, n, m) for m in conversations]
        self.requested.update(keys)
        have = {k: json.loads(v) for k, v in self.cache.get_many(sorted(set(keys))).items()}
        self.stats["cached"] += sum(k in have for k in keys)
        self.reused_keys.update(k for k in keys if k in have and k not in self.written)
        self.stats["reused"] = len(self.reused_keys)
        todo = list({k: m for k, m in zip(keys, conversations) if k not in have}.items())

        def done(part: list, outs: list) -> None:
            self.cache.put_many([(k, json.dumps(o)) for (k, _), o in zip(part, outs)])
            self.written.update(k for k, _ in part)
            have.update({k: o for (k, _), o in zip(part, outs)})
            self.stats["calls"] += len(part)
            self._count_local([m for _, m in part], outs)
            if self.on_call is not None:
                self.on_call()

        t0 = time.perf_counter()
        if isinstance(self.llm, OpenAIEndpoint) and self.concurrency > 1 and len(todo) > 1:
            from concurrent.futures import ThreadPoolExecutor, as_completed

            with ThreadPoolExecutor(min(self.concurrency, len(todo))) as pool:
                futures = {pool.submit(fn, [m]): (k, m) for k, m in todo}
                failed: Exception | None = None
                for f in as_completed(futures):
                    if f.exception() is not None:  # the others still finish and are kept
                        failed = failed or f.exception()
                        continue
                    done([futures[f]], f.result())  # written at once: a kill loses no finished call
            if failed is not None:
                raise failed
        else:
            step = 1 if isinstance(self.llm, OpenAIEndpoint) else max(1, getattr(self.llm, "batch_size", 1))
            for i in range(0, len(todo), step):
                part = todo[i : i + step]
                done(part, fn([m for _, m in part]))
        if todo:
            self.stats["call_s"] += time.perf_counter() - t0
        return [have[k] for k in keys]


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
