"""An SGLang server double: SGLang's native HTTP API over a real model (transformers + peft on
the CPU), so Reef's SGLang runtime is tested against the protocol, not against canned answers.

    python -m tests.helpers.sglang_double --model-path DIR --port 30000 --enable-lora

The flags are `python -m sglang.launch_server`'s (`--model-path`, `--tokenizer-path`, `--host`,
`--port`, `--served-model-name`, `--enable-lora`, `--max-lora-rank`,
`--incremental-streaming-output`), so one command template starts either.

What it follows: SGLang's documentation (docs/basic_usage/native_api, sampling_params,
advanced_features/lora) and its HTTP server (`srt/entrypoints/http_server.py`,
`srt/managers/io_struct.py`) as of the 0.5 series:

- `GET /health`, `/health_generate`: 200, empty body, once the model is loaded.
- `GET /get_model_info`: `model_path`, `tokenizer_path`, `is_generation`,
  `preferred_sampling_params`, `weight_version`. `GET /v1/models`: the served model's card.
- `POST /generate` (`GenerateReqInput`, one prompt): `text` or `input_ids`, `sampling_params`
  (`max_new_tokens` 128, `temperature` 1.0 (0: greedy), `top_p`, `top_k`, `min_p`, penalties
  (1.0 / 0.0 only), `stop`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
  `no_stop_trim`, `sampling_seed`), `return_logprob`, `logprob_start_len`, `top_logprobs_num`
  (0 only), `stream`, `lora_path` (a loaded adapter's name), `rid`. The answer is `{text,
  output_ids, meta_info: {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens,
  weight_version, output_token_logprobs: [[logprob, token_id, null], ...], e2e_latency}}`;
  `finish_reason` is null while running, then `{"type": "stop", "matched": id | str}`,
  `{"type": "length", "length": n}` or `{"type": "abort", "message": ...}`. Streamed, each
  event is `data: <that object>` (text, ids and log-probs so far; only the new ones with
  `--incremental-streaming-output`) and the stream ends with `data: [DONE]`. A refused request
  is 400 `{"error": {"message"}}`, or, streamed, 200 with that object as its one event (SGLang
  raises ValueError inside the stream); an unknown `lora_path` is refused with SGLang's words
  "The following requested LoRA adapters are not loaded: ...".
- `POST /load_lora_adapter {lora_name, lora_path, pinned}`, `POST /unload_lora_adapter
  {lora_name}`: `{success, error_message, loaded_adapters: {name: path}}`, 400 on failure (a
  name already loaded, an unknown name, a folder peft cannot load, LoRA not enabled).
- `POST /pause_generation {mode: abort | retract | in_place}` (abort: running requests end
  with an abort finish reason) and `POST /continue_generation`: generation waits in between.
- `POST /update_weights_from_disk {model_path, load_format, abort_all_requests, weight_version,
  flush_cache, ...}` (`UpdateWeightFromDiskReqInput`; docs/advanced_features/sglang_for_rl): the
  weights read from the folder's safetensors, in place, once the running request ends;
  `{success, message, num_paused_requests}`, 400 with `success: false` when the folder cannot be
  read or names a weight the model lacks (the model keeps its weights). `weight_version` then
  shows in `/get_model_info` and every answer's `meta_info`.

Sampling is SGLang's: the log-prob of a sampled token is taken from the temperature-scaled
distribution before top-k/top-p (SGLang's default; `SGLANG_RETURN_ORIGINAL_LOGPROB` unset), the
model's own distribution when greedy. Unlike SGLang, `sampling_seed` is always honoured (SGLang
honours it under `--enable-deterministic-inference`), requests run one at a time, and an
unknown sampling parameter is a 400 rather than a server error, so Reef cannot send one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

SAMPLING_KEYS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
    "min_new_tokens",
}
NOT_LOADED = "The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: {loaded}."


class Refused(ValueError):
    """A request SGLang answers with its `{"error": {"message"}}` (its ValueError path)."""


class Model:
    """The model, its tokenizer and the named LoRA adapters, used by one request at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or args.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.adapters: dict[str, str] = {}  # name -> the folder it was loaded from
        self.lock = asyncio.Lock()
        self.running = asyncio.Event()
        self.running.set()
        self.aborts = 0  # bumped by pause_generation(abort): running requests end
        self.weight_version = "default"

    def use(self, adapter: str | None) -> None:
        if adapter is None:
            if self.adapters:
                self.model.disable_adapters()
        else:
            self.model.enable_adapters()
            self.model.set_adapter(adapter)

    def load(self, name: str, path: str) -> None:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
        if self.args.max_lora_rank and int(config.get("r", 0)) > self.args.max_lora_rank:
            raise ValueError(
                f"LoRA adapter {name} has rank {config.get('r')}, above --max-lora-rank {self.args.max_lora_rank}"
            )
        try:
            self.model.load_adapter(path, adapter_name=name)
        except Exception:
            if name in (getattr(self.model, "peft_config", None) or {}):
                self.model.delete_adapter(name)
            raise
        self.adapters[name] = path

    def update_from_disk(self, path: str) -> None:
        """Every weight in the folder's safetensors files, copied into the model in place (all
        checked first, so a bad folder changes nothing); a weight wrapped by a LoRA layer is its
        `base_layer`'s."""
        import torch
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"no safetensors files in {path}")
        tensors = {name: t for f in files for name, t in load_file(str(f)).items()}
        params = dict(self.model.named_parameters())
        targets = {}
        for name, tensor in tensors.items():
            head, _, leaf = name.rpartition(".")
            target = params[name] if name in params else params.get(f"{head}.base_layer.{leaf}")
            if target is None or target.shape != tensor.shape:
                raise ValueError(f"weight {name} {tuple(tensor.shape)} is not the model's")
            targets[name] = target
        with torch.no_grad():
            for name, target in targets.items():
                target.copy_(tensors[name])

    def unload(self, name: str) -> None:
        self.model.delete_adapter(name)
        del self.adapters[name]


class Request:
    """One `/generate` call: its prompt, sampling parameters and the tokens made so far."""

    def __init__(self, model: Model, body: dict[str, Any]) -> None:
        import torch

        self.model = model
        self.rid = str(body.get("rid") or secrets.token_hex(16))
        self.prompt = prompt_of(model, body)
        self.params = sampling_of(body.get("sampling_params") or {})
        self.lora = body.get("lora_path")
        if self.lora is not None and self.lora not in model.adapters:
            loaded = {k: None for k in model.adapters}.keys()
            raise Refused(NOT_LOADED.format(name=self.lora, loaded=loaded))
        if int(body.get("top_logprobs_num") or 0):
            raise Refused("the double gives no top log-probs (top_logprobs_num 0 only)")
        self.logprob = bool(body.get("return_logprob"))
        seed = self.params.get("sampling_seed")
        self.generator = torch.Generator().manual_seed(int(seed) if seed is not None else secrets.randbits(63))
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: dict[str, Any] | None = None
        self.started = time.monotonic()

    def chunk(self, since: int = 0) -> dict[str, Any]:
        """The answer so far in SGLang's shape; `since`: tokens already sent (incremental)."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish,
            "prompt_tokens": len(self.prompt),
            "weight_version": self.model.weight_version,
            "completion_tokens": len(self.ids),
            "cached_tokens": 0,
        }
        if self.logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(self.logprobs[since:], self.ids[since:])]
        if self.finish is not None:
            meta["e2e_latency"] = time.monotonic() - self.started
        text = self.text()[len(self.text(since)) :] if since else self.text()
        return {"text": text, "output_ids": self.ids[since:], "meta_info": meta}

    def text(self, upto: int | None = None) -> str:
        """The text of the first `upto` tokens (all: None) as SGLang gives it: special tokens
        skipped unless asked for, and a finished answer's matched stop trimmed (unless
        `no_stop_trim`)."""
        ids = self.ids[:upto]
        trim = upto is None and self.finish is not None and not self.params["no_stop_trim"]
        matched = self.finish.get("matched") if trim and self.finish else None
        if isinstance(matched, int):
            ids = ids[:-1]
        text = str(self.model.tokenizer.decode(ids, skip_special_tokens=self.params["skip_special_tokens"]))
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return text


def prompt_of(model: Model, body: dict[str, Any]) -> list[int]:
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise Refused("Either text or input_ids should be provided.")
    if text is not None:
        if not isinstance(text, str):
            raise Refused("the double serves one prompt a request")
        return list(model.tokenizer(text)["input_ids"])
    if not ids or not all(isinstance(t, int) for t in ids):
        raise Refused("the double serves one prompt a request: input_ids is a non-empty list of token ids")
    vocab = model.model.config.vocab_size
    if any(t < 0 or t >= vocab for t in ids):
        raise Refused(f"input_ids holds a token id outside the vocabulary (0..{vocab - 1})")
    return list(ids)


def sampling_of(params: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise Refused(f"SamplingParams got unexpected keyword arguments {unknown}")
    for key, neutral in (("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if float(params.get(key, neutral)) != neutral:
            raise Refused(f"the double applies no {key}")
    out = {
        "max_new_tokens": 128,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "stop": [],
        "stop_token_ids": [],
        "ignore_eos": False,
        "skip_special_tokens": True,
        "no_stop_trim": False,
        "sampling_seed": None,
        **params,
    }
    out["stop"] = [out["stop"]] if isinstance(out["stop"], str) else list(out["stop"] or [])
    if not 0 < float(out["top_p"]) <= 1:
        raise Refused("top_p must be in (0, 1], got {}.".format(out["top_p"]))
    if float(out["temperature"]) < 0:
        raise Refused("temperature must be non-negative, got {}.".format(out["temperature"]))
    return out


def pick(logits: Any, params: dict[str, Any], generator: Any) -> tuple[int, float]:
    """SGLang's sampler: greedy below a temperature of 1e-5 (the model's own log-prob), else
    top-k / top-p / min-p sampling from the temperature-scaled distribution, whose log-prob
    (before those filters) is reported."""
    import torch

    if float(params["temperature"]) < 1e-5 or int(params["top_k"]) == 1:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    probs = torch.softmax(logits / float(params["temperature"]), -1)
    kept = probs.clone()
    order = torch.argsort(kept, descending=True)
    ranked = kept[order]
    drop = (torch.cumsum(ranked, -1) - ranked) > float(params["top_p"])
    if int(params["top_k"]) > 0:
        drop[int(params["top_k"]) :] = True
    drop |= ranked < float(params["min_p"]) * ranked[0]
    drop[0] = False
    kept[order[drop]] = 0.0
    token = int(torch.multinomial(kept / kept.sum(), 1, generator=generator))
    return token, float(torch.log(probs[token]))


async def run(model: Model, request: Request) -> AsyncIterator[None]:
    """Decode `request` token by token (the model under the lock, each step in a thread), after
    each token yielding so the caller can stream it; `request.finish` is set at the end."""
    import torch

    params, epoch = request.params, model.aborts
    async with model.lock:
        model.use(request.lora)
        cache: Any = None
        feed = torch.tensor([request.prompt])
        while request.finish is None:
            await model.running.wait()
            if model.aborts != epoch:
                request.finish = {"type": "abort", "message": "Abort in waiting queue.", "status_code": 503}
                break

            def step(feed: Any = feed, cache: Any = cache) -> tuple[Any, Any]:
                with torch.no_grad():
                    out = model.model(input_ids=feed, past_key_values=cache, use_cache=True)
                return out.logits[0, -1].float(), out.past_key_values

            logits, cache = await asyncio.to_thread(step)
            token, logprob = pick(logits, params, request.generator)
            request.ids.append(token)
            request.logprobs.append(logprob)
            request.finish = finish_of(model, request, token)
            feed = torch.tensor([[token]])
            yield


def finish_of(model: Model, request: Request, token: int) -> dict[str, Any] | None:
    p = request.params
    if len(request.ids) > int(p.get("min_new_tokens") or 0):
        if token in p["stop_token_ids"] or (not p["ignore_eos"] and token in model.eos):
            return {"type": "stop", "matched": token}
        text = model.tokenizer.decode(request.ids, skip_special_tokens=p["skip_special_tokens"])
        for stop in p["stop"]:
            if stop and stop in text:
                return {"type": "stop", "matched": stop}
    if len(request.ids) >= int(p["max_new_tokens"]):
        return {"type": "length", "length": int(p["max_new_tokens"])}
    return None


def create_app(model: Model) -> FastAPI:
    app = FastAPI()
    args = model.args

    def lora_result(ok: bool, error: str | None = None) -> JSONResponse:
        return JSONResponse(
            {"success": ok, "error_message": error, "loaded_adapters": dict(model.adapters)},
            status_code=200 if ok else 400,
        )

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": model.weight_version,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        name = args.served_model_name or args.model_path
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name}],
        }

    @app.post("/generate")
    async def generate(http: HTTPRequest) -> Response:
        body = await http.json()
        try:
            request = Request(model, body)
        except Refused as exc:
            if body.get("stream"):
                return StreamingResponse(_refused_stream(str(exc)), media_type="text/event-stream")
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        if not body.get("stream"):
            async for _ in run(model, request):
                pass
            return JSONResponse(request.chunk())
        return StreamingResponse(_stream(model, request), media_type="text/event-stream")

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(http: HTTPRequest) -> JSONResponse:
        body = await http.json()
        name, path = str(body.get("lora_name") or ""), str(body.get("lora_path") or "")
        if not args.enable_lora:
            return lora_result(False, "LoRA is not enabled. Please set `--enable-lora` to True.")
        if name in model.adapters:
            return lora_result(False, f"The LoRA adapter with name {name} already exists.")
        async with model.lock:
            try:
                await asyncio.to_thread(model.load, name, path)
            except Exception as exc:  # SGLang reports any loading error as a failed update
                return lora_result(False, f"Failed to load LoRA adapter {name} from {path}: {exc}")
        return lora_result(True)

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(http: HTTPRequest) -> JSONResponse:
        name = str((await http.json()).get("lora_name") or "")
        if name not in model.adapters:
            return lora_result(False, f"LoRA with name {name} does not exist. Loaded LoRAs: {list(model.adapters)}")
        async with model.lock:
            model.unload(name)
        return lora_result(True)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(http: HTTPRequest) -> JSONResponse:
        body = await http.json()
        path = str(body.get("model_path") or "")
        async with model.lock:  # the running request ends first
            try:
                await asyncio.to_thread(model.update_from_disk, path)
            except Exception as exc:  # SGLang answers a failed update with success false
                message = f"Failed to update weights: {exc}. Rolling back to original weights."
                return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
            if body.get("weight_version") is not None:
                model.weight_version = str(body["weight_version"])
        message = "Succeeded to update model weights."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/pause_generation")
    async def pause_generation(http: HTTPRequest) -> JSONResponse:
        raw = await http.body()
        mode = (json.loads(raw) if raw else {}).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"error": {"message": f"Invalid mode: {mode!r}."}}, status_code=400)
        if mode == "abort":
            model.aborts += 1
        model.running.clear()
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        model.running.set()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    return app


async def _stream(model: Model, request: Request) -> AsyncIterator[bytes]:
    sent = 0
    async for _ in run(model, request):
        chunk = request.chunk(sent if model.args.incremental_streaming_output else 0)
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        sent = len(request.ids)
    yield b"data: [DONE]\n\n"


async def _refused_stream(message: str) -> AsyncIterator[bytes]:
    yield b"data: " + json.dumps({"error": {"message": message}}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="An SGLang server double (tests/helpers/sglang_double.py)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tokenizer-path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name")
    parser.add_argument("--enable-lora", action="store_true")
    parser.add_argument("--max-lora-rank", type=int)
    parser.add_argument("--incremental-streaming-output", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import torch
    import uvicorn

    args = parse_args(argv)
    torch.set_num_threads(1)  # a test machine's cores belong to Reef and its tests
    model = Model(args)
    uvicorn.run(create_app(model), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
