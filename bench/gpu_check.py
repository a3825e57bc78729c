"""One command that checks the full-weight path on a machine with GPUs: installs the engines, trains a
few full-weight and LoRA steps on the GPU with 1 rank (and 2 where there are two GPUs), pushes each
checkpoint into vLLM and SGLang under load and rolls back to the base, printing each step's time.

    python bench/gpu_check.py --model /models/Qwen3-0.6B          # a model folder on this machine
    python bench/gpu_check.py --cpu                                # the reduced form (the test suite runs it)

Steps, each printed as it ends:
1. install: `vllm` and `sglang[all]` from the package index, each in a virtual environment of its
   own under `--work` (skipped with `--no-install`, or `--cpu`: there the engines already
   installed are used, vLLM's CPU build in Reef's cache);
2. train: `learner.device` cuda (cpu with `--cpu`), through Reef's training process
   (`TrainingWorker`, torchrun for 2 ranks): `--steps` cross-entropy steps on one fixed sequence,
   full weights with 1 and 2 ranks, LoRA with 1; training tokens a second, and the checkpoint;
3. push: per engine (the embedded runtime with `--cpu`, vLLM, SGLang; an engine not installed is
   skipped, saying so), the base loaded and `--clients` greedy requests in a loop, then each
   checkpoint loaded (`Runtime.load`: the push) and the base loaded again (the rollback): sync
   seconds, requests served during the swap, failed requests, and whether the greedy answer
   changed and came back.

Exit status 1 if any request failed, any push raised, or a rollback did not serve the base's
answer again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from reef.core.chat import ChatRequest, ChatResult, Message  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.runtimes.base import Runtime  # noqa: E402

ASK = ChatRequest(
    model="m", messages=(Message("user", "Name a colour."),), dialect="openai", temperature=0, max_tokens=8
)
PACKAGES = {"vllm": ["vllm"], "sglang": ["sglang[all]"]}
problems: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)


# -- 1. install ------------------------------------------------------------------------------


def install(engine: str, work: Path) -> Path | None:
    """A virtual environment with the engine, its python (None if the install failed)."""
    env = work / f"{engine}-env"
    python = env / "bin" / "python"
    started = time.monotonic()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES[engine]], check=False)
    if done.returncode != 0:
        say(f"install {engine}: FAILED (pip exited {done.returncode}); {engine} is skipped")
        return None
    say(f"install {engine}: {time.monotonic() - started:.0f} s ({env})")
    return python


# -- 2. train --------------------------------------------------------------------------------


async def train(model: Path, device: str, weights: str, ranks: int, steps: int) -> dict[str, bytes]:
    """`steps` cross-entropy steps on one sequence in Reef's training process; the checkpoint."""
    from transformers import AutoTokenizer

    from reef.core.training import AdamParams, Datum
    from reef.grow.rank_launch import RankLayout
    from reef.grow.training_client import TrainingClient
    from reef.grow.worker import TrainingWorker

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompt = tokenizer("Name a colour.")["input_ids"] or [1]
    completion = tokenizer(" Blue, the colour of the sea and the sky on a clear day.")["input_ids"]
    datum = Datum(prompt, completion, [], [1.0] * len(completion), [1.0] * len(completion))
    worker = TrainingWorker(model, device=device, weights=weights, layout=RankLayout(ranks=ranks))
    started = time.monotonic()
    await worker.start()
    try:
        client = TrainingClient(worker, "gpu-check")
        await client.load_state(None)
        tokens, began = 0.0, time.monotonic()
        for _ in range(steps):
            metrics = await client.forward_backward([datum], "cross_entropy")
            await client.optim_step(
                AdamParams(lr=1e-2 if weights == "lora" else 1e-3)
            )  # a check: the answers must move
            tokens += float(metrics.get("tokens", len(completion)))
        rate = tokens / (time.monotonic() - began)
        checkpoint = await client.save_state()
    finally:
        await worker.close()
    say(
        f"train {weights} on {device}, {ranks} rank(s): {steps} steps, {rate:.0f} training tokens/s "
        f"(start {began - started:.1f} s, loss {metrics.get('loss', float('nan')):.3f})"
    )
    return checkpoint


# -- 3. push ---------------------------------------------------------------------------------


async def greedy(runtime: Runtime, load_id: str) -> list[int]:
    result = ChatResult()
    async for delta in runtime.generate(ASK, ReleaseRef("check", "check", load_id)):
        result.add(delta)
    return result.token_ids


class Load:
    """`clients` greedy requests in a loop on whatever load is serving; counts and failures."""

    def __init__(self, runtime: Runtime, clients: int) -> None:
        self.runtime, self.clients = runtime, clients
        self.serving = ""
        self.served = 0
        self.failures: list[str] = []
        self.pinned: dict[str, int] = {}  # load id -> requests on it now (unloaded only once none is)
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, serving: str) -> None:
        self.serving = serving
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.clients)]

    async def _loop(self) -> None:
        while not self._stop:
            load_id = self.serving
            self.pinned[load_id] = self.pinned.get(load_id, 0) + 1
            try:
                await greedy(self.runtime, load_id)
                self.served += 1
            except Exception as exc:  # counted: the check is that there are none
                self.failures.append(repr(exc))
            finally:
                self.pinned[load_id] -= 1

    async def unload(self, load_id: str) -> None:
        """Unload once no request is on it, as the server does."""
        while self.pinned.get(load_id):
            await asyncio.sleep(0.05)
        await self.runtime.unload(load_id)

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)


async def push(runtime: Runtime, load: Load, name: str, files: Mapping[str, bytes]) -> tuple[str, float, int]:
    """Load `files` while the requests run and serve it: its load id, sync seconds, requests served meanwhile."""
    served, started = load.served, time.monotonic()
    load_id = await runtime.load(name, files)
    seconds = time.monotonic() - started
    load.serving = load_id
    return load_id, seconds, load.served - served


async def check_engine(
    engine: str, runtime: Runtime, checkpoints: Mapping[str, dict[str, bytes]], clients: int
) -> None:
    await runtime.start()
    load = Load(runtime, clients)
    try:
        base = await runtime.load("base", {})
        base_ids = await greedy(runtime, base)
        load.start(base)
        for name, files in checkpoints.items():
            try:
                load_id, seconds, during = await push(runtime, load, name, files)
                changed = await greedy(runtime, load_id) != base_ids
                back, back_s, _ = await push(runtime, load, f"{name} rollback", {})
                restored = await greedy(runtime, back) == base_ids
            except Exception as exc:
                problems.append(f"{engine} {name}: {exc!r}")
                say(f"push {name} into {engine}: FAILED {exc!r}")
                continue
            if not restored:
                problems.append(f"{engine} {name}: the rollback did not serve the base's answer")
            say(
                f"push {name} into {engine}: sync {seconds:.2f} s, {during} request(s) served during the swap, "
                f"answer changed: {changed}; rollback to the base {back_s:.2f} s, base's answer again: {restored}"
            )
            await load.unload(load_id)
    finally:
        await load.stop()
        failures = len(load.failures)
        say(
            f"{engine}: {load.served} requests served, {failures} failed"
            + (f" ({load.failures[0]})" if failures else "")
        )
        if failures:
            problems.append(f"{engine}: {failures} failed request(s)")
        await runtime.close()


def engines(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """The runtimes to check, by engine; an engine not installed is skipped, saying so."""
    found: dict[str, Any] = {}
    wanted = args.engines.split(",")
    if "embedded" in wanted and args.cpu:
        from reef.runtimes.embedded import EmbeddedRuntime

        found["embedded"] = EmbeddedRuntime(model)
    if "vllm" in wanted:
        found.update(vllm_runtime(args, model, work))
    if "sglang" in wanted:
        found.update(sglang_runtime(args, model, work))
    return found


def vllm_runtime(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    from reef.runtimes.vllm import VLLMRuntime
    from reef.runtimes.vllm_env import VLLMProcess, default_env_dir, env_ready

    python = work / "vllm-env" / "bin" / "python"
    if args.cpu or not python.exists():
        python = default_env_dir() / "bin" / "python"
        if not env_ready(default_env_dir()):
            say("vllm: not installed (scripts/setup --vllm, or run without --cpu to install it): skipped")
            return {}
    process = VLLMProcess(
        python,
        model,
        "check",
        args=["--enable-lora", "--max-lora-rank", "16", "--max-model-len", "2048", *(["--enforce-eager"] * args.cpu)],
        env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "2"},
        log_path=work / "vllm.log",
        startup_timeout=900,
    )
    return {"vllm": VLLMRuntime(process=process, adapter_dir=work / "vllm-loads", load_timeout=600)}


def sglang_runtime(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    python = work / "sglang-env" / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import sglang"], check=False).returncode:
        say("sglang: not installed (run without --cpu and --no-install to install it): skipped")
        return {}
    from reef.runtimes.sglang import SGLangRuntime
    from tests.helpers.reef_server import free_port

    port = free_port()
    command = [str(python), "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    log = open(work / "sglang.log", "wb")  # noqa: SIM115  (closed with the process, at exit)
    subprocess.Popen([*command, "--enable-lora", "--max-lora-rank", "16"], stdout=log, stderr=subprocess.STDOUT)
    say(f"sglang: starting on port {port} (log {work / 'sglang.log'})")
    return {"sglang": SGLangRuntime(f"http://127.0.0.1:{port}", adapter_dir=work / "sglang-loads", model_dir=model)}


# -- the command -----------------------------------------------------------------------------


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


async def run(args: argparse.Namespace, model: Path, work: Path) -> None:
    device = "cpu" if args.cpu else "cuda"
    ranks = [r for r in (1, 2) if r <= (args.max_ranks if args.cpu else gpus())]
    if not ranks:
        raise SystemExit("no GPU here: run with --cpu for the reduced form")
    checkpoints = {}
    kinds = args.weights.split(",")
    for r in ranks if "full" in kinds else ():
        checkpoints[f"full ({r} rank{'s' * (r > 1)})"] = await train(model, device, "full", r, args.steps)
    if "lora" in kinds:
        checkpoints["lora"] = await train(model, device, "lora", 1, args.steps)
    for engine, runtime in engines(args, model, work).items():
        if engine == "sglang":
            await wait_healthy(runtime)
        await check_engine(engine, runtime, checkpoints, args.clients)


async def wait_healthy(runtime: Any, timeout: float = 900) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{runtime.url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(2)
    raise SystemExit(f"SGLang did not answer /health within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder (required without --cpu)")
    parser.add_argument("--cpu", action="store_true", help="the reduced form: CPU, the tiny model unless --model")
    parser.add_argument("--engines", default="embedded,vllm,sglang", help="comma-separated: embedded, vllm, sglang")
    parser.add_argument("--weights", default="full,lora", help="comma-separated: full, lora")
    parser.add_argument("--steps", type=int, default=3, help="training steps per checkpoint")
    parser.add_argument("--clients", type=int, default=4, help="greedy requests in a loop during the pushes")
    parser.add_argument(
        "--max-ranks", type=int, default=1, help="with --cpu: train full weights on 1 and up to this many ranks"
    )
    parser.add_argument("--no-install", action="store_true", help="use the engines already installed under --work")
    parser.add_argument(
        "--work", type=Path, help="where the environments, logs and loads go (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    problems.clear()
    with tempfile.TemporaryDirectory(prefix="reef-gpu-check-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if not args.cpu and not args.no_install:
            for engine in PACKAGES:
                install(engine, work)
        model = args.model
        if model is None:
            if not args.cpu:
                parser.error("--model is required on a GPU machine")
            from reef.runtimes.model_files import build_tiny_model

            model = build_tiny_model(work / "tiny")
        asyncio.run(run(args, model, work))
    say("gpu check: " + ("OK" if not problems else "PROBLEMS: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
