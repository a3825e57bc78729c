"""The engine contract on real engines: the checks tests/test_sglang_runtime.py runs against the
SGLang double, run against a real SGLang and a real GPU vLLM, each with `reef serve` attached.

The checks are tests/helpers/engine_contract.py's, the same code as the tests': both SDKs
(OpenAI, Anthropic), plain and streaming, recorded with the engine's token ids and log-probs and
verified; /v1/models and /reef/status name the engine; a LoRA release served by the next
request (the greedy answer changes), a corrupt one refused while it keeps serving, a rollback
that unloads it from the engine; the engine killed with SIGKILL answered with 503s in both
dialects, then started again by this script and given the adapter back under the same name.

For each engine (SGLang first, then vLLM, one at a time on the GPU) the script starts the engine
on a free loopback port, writes a state directory (base, LoRA adapter, corrupt adapter; serving
the base), starts `reef serve` attached to the engine (`sglang.url`, `vllm.url`), runs the checks
and stops both. It prints PASS/FAIL per check and writes the results, with what each check
measured (adapter load time, seconds back after the kill, ...), as JSON.

How to run it, on a Linux machine with one NVIDIA GPU and internet access (engines in
environments of their own: their torch pins differ from each other and from Reef's):

    scripts/setup                                   # Reef's .venv (embedded + test extras)
    python3 -m venv /opt/sglang && /opt/sglang/bin/pip install "sglang[all]>=0.5.3"
    python3 -m venv /opt/vllm && /opt/vllm/bin/pip install "vllm>=0.11"
    .venv/bin/python bench/engine_contract.py --sglang-python /opt/sglang/bin/python \\
        --vllm-python /opt/vllm/bin/python

The model is Reef's default, SmolLM2-135M-Instruct, converted once into Reef's cache
($REEF_CACHE_DIR or ~/.cache/reef) as `reef serve` does (or `--model-dir DIR`, a Hugging Face
folder with a ChatML chat template); the LoRA adapter is made on it here (rank 4, random B
matrices). Sized for under 8 minutes on one H200 (each engine starts twice, CUDA graphs off; not
run on a GPU yet); `--budget` (default 480 s) skips the checks left when time runs out.

Other ways in: `--engines sglang` (or vllm) runs one; `--sglang-url URL` attaches to an SGLang
already running on this machine (started with --enable-lora; the restart check is skipped: the
script cannot restart what it did not start); `--sglang-command` replaces the launch line, e.g.
to run the whole contract against the double on a CPU:

    .venv/bin/python bench/engine_contract.py --engines sglang --model-dir /tmp/tiny \\
        --sglang-command "{python} -m tests.helpers.sglang_double --model-path {model} --port {port} --enable-lora"

Writes bench/results/engine_contract.json (`--out`); exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.engine_contract import CHECKS, Contract, make_releases  # noqa: E402
from tests.helpers.engine_process import EngineProcess  # noqa: E402
from tests.helpers.reef_server import ReefServer, free_port  # noqa: E402

LORA_MODULES = "q_proj k_proj v_proj o_proj up_proj down_proj"  # what tests/helpers/lora.py adapts
LAUNCH = {
    "sglang": "{python} -m sglang.launch_server --model-path {model} --host 127.0.0.1 --port {port} --enable-lora "
    f"--max-lora-rank 16 --max-loras-per-batch 4 --lora-target-modules {LORA_MODULES} "
    "--dtype bfloat16 --mem-fraction-static 0.3 --disable-cuda-graph --log-level warning",
    "vllm": "{python} -m vllm.entrypoints.openai.api_server --model {model} --served-model-name base "
    "--host 127.0.0.1 --port {port} --enable-lora --max-lora-rank 16 --max-loras 4 --max-model-len 2048 "
    "--dtype bfloat16 --gpu-memory-utilization 0.3 --enforce-eager --logprobs-mode processed_logprobs",
}
ENGINE_ENV = {"vllm": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}, "sglang": {}}


def reef_settings(engine: str, url: str, state_dir: Path, model_dir: Path) -> dict[str, Any]:
    """`reef serve` attached to the engine, learning off, short answers."""
    settings: dict[str, Any] = {"state_dir": str(state_dir), "runtime": engine, "learner": {"enabled": False}}
    if engine == "sglang":
        settings["sglang"] = {
            "url": url,
            "model_dir": str(model_dir),
            "model_name": "base",
            "default_max_tokens": 8,
            "load_timeout": 120,
        }
    else:
        settings["vllm"] = {"url": url, "model_name": "base", "default_max_tokens": 8, "load_timeout": 120}
    return settings


def start_engine(engine: str, args: argparse.Namespace, model_dir: Path, work: Path) -> EngineProcess | None:
    """The engine this script runs (None when attaching to `--<engine>-url`)."""
    if getattr(args, f"{engine}_url"):
        return None
    port = free_port()
    template = getattr(args, f"{engine}_command") or LAUNCH[engine]
    command = shlex.split(template.format(python=getattr(args, f"{engine}_python"), model=model_dir, port=port))
    env = {"PYTHONPATH": str(ROOT), **ENGINE_ENV[engine]}
    process = EngineProcess(
        command, port, log_path=work / f"{engine}.log", env=env, startup_timeout=args.startup_timeout
    )
    started = time.monotonic()
    print(f"[{engine}] starting: {' '.join(command)}", flush=True)
    process.start()
    print(f"[{engine}] healthy after {time.monotonic() - started:.0f}s (log {process.log_path})", flush=True)
    return process


def run_checks(contract: Contract, deadline: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, check in CHECKS:
        if name == "engine_restart" and contract.restart_engine is None:
            results[name] = {"ok": None, "skipped": "attached to --url: this script cannot restart the engine"}
        elif time.monotonic() > deadline:
            results[name] = {"ok": None, "skipped": "out of time (--budget)"}
        else:
            results[name] = run_one(check, contract)
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[results[name]["ok"]]
        detail = results[name].get("measured") or results[name].get("error") or results[name].get("skipped")
        print(f"[{contract.engine}] {verdict} {name} ({results[name].get('seconds', 0):.1f}s) {detail}", flush=True)
    return results


def run_one(check: Any, contract: Contract) -> dict[str, Any]:
    started = time.monotonic()
    try:
        measured = check(contract)
    except Exception as exc:  # a failed check is reported, and the next one runs
        return {
            "ok": False,
            "seconds": round(time.monotonic() - started, 1),
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=4),
        }
    return {"ok": True, "seconds": round(time.monotonic() - started, 1), "measured": measured}


def run_engine(engine: str, args: argparse.Namespace, model_dir: Path, deadline: float) -> dict[str, Any]:
    """Engine up, releases written, Reef attached, the checks; everything stopped after."""
    work = Path(tempfile.mkdtemp(prefix=f"reef-contract-{engine}-"))
    process: EngineProcess | None = None
    try:
        process = start_engine(engine, args, model_dir, work)
        url = process.url if process else getattr(args, f"{engine}_url").rstrip("/")
        releases = make_releases(model_dir, work / "state", work)
        settings = reef_settings(engine, url, work / "state", model_dir)
        with ReefServer(work, settings, env={"REEF_CACHE_DIR": str(work / "cache")}, startup_timeout=300) as reef:
            contract = Contract(
                reef.url,
                engine,
                url,
                releases,
                kill_engine=process.kill if process else _no_kill,
                restart_engine=process.start if process else None,
                timeout=120,
                back_within=300,
            )
            return {
                "url": url,
                "version": engine_version(engine, args),
                "work": str(work),
                "checks": run_checks(contract, deadline),
            }
    except Exception as exc:  # the engine or Reef did not start: every check fails with why
        log = (
            process.log_tail()
            if process
            else (work / f"{engine}.log").read_text(errors="replace")[-4000:]
            if (work / f"{engine}.log").exists()
            else ""
        )
        print(f"[{engine}] setup failed: {exc}", flush=True)
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "engine_log_tail": log,
            "work": str(work),
            "checks": {name: {"ok": False, "error": "not run: setup failed"} for name, _ in CHECKS},
        }
    finally:
        if process is not None:
            process.stop()


def _no_kill() -> None:
    raise AssertionError("attached to --url: this script cannot kill the engine")


def engine_version(engine: str, args: argparse.Namespace) -> str | None:
    python = getattr(args, f"{engine}_python")
    found = subprocess.run(
        [python, "-c", f"import {engine}; print({engine}.__version__)"], capture_output=True, text=True, timeout=120
    )
    return found.stdout.strip() or None


def model_folder(args: argparse.Namespace) -> Path:
    if args.model_dir:
        return Path(args.model_dir).resolve()
    from reef.runtimes.model_files import default_cache_dir, ensure_embedded_model

    return ensure_embedded_model(default_cache_dir(), lambda message: print(message, flush=True))


def machine() -> dict[str, Any]:
    gpu = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True
        )
        if _has("nvidia-smi")
        else None
    )
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "gpu": gpu.stdout.strip() if gpu else None}


def _has(program: str) -> bool:
    return any((Path(d) / program).exists() for d in os.environ.get("PATH", "").split(os.pathsep))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run the engine contract (tests/helpers/engine_contract.py) "
        "against a real SGLang and a real GPU vLLM.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--engines", nargs="+", choices=["sglang", "vllm"], default=["sglang", "vllm"])
    parser.add_argument("--model-dir", help="a Hugging Face model folder; default: Reef's SmolLM2-135M-Instruct")
    for engine in ("sglang", "vllm"):
        parser.add_argument(
            f"--{engine}-python", default=sys.executable, help=f"the python of the environment {engine} is installed in"
        )
        parser.add_argument(f"--{engine}-url", help=f"attach to this running {engine} instead of starting one")
        parser.add_argument(
            f"--{engine}-command",
            help=f"launch line template ({{python}} {{model}} {{port}}); default: {LAUNCH[engine]}",
        )
    parser.add_argument("--startup-timeout", type=float, default=300, help="seconds an engine may take to start")
    parser.add_argument("--budget", type=float, default=480, help="seconds; checks left after it are skipped")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_contract.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer and adapter come from the model folder
    started = time.monotonic()
    model_dir = model_folder(args)
    results = {engine: run_engine(engine, args, model_dir, started + args.budget) for engine in args.engines}
    for result in results.values():  # a failure's work folder (logs, state) stays for a look
        if all(check["ok"] is not False for check in result["checks"].values()):
            shutil.rmtree(result.pop("work"), ignore_errors=True)
    verdicts = [check["ok"] for result in results.values() for check in result["checks"].values()]
    summary = {
        "passed": verdicts.count(True),
        "failed": verdicts.count(False),
        "skipped": verdicts.count(None),
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "engine_contract",
                "model_dir": str(model_dir),
                "machine": machine(),
                "summary": summary,
                "engines": results,
            },
            indent=2,
        )
    )
    print(
        f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped "
        f"in {summary['seconds']:.0f}s; results in {args.out}"
    )
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
