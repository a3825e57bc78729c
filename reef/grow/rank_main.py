"""One rank of the distributed training job: `python -m torch.distributed.run ... -m reef.grow.rank_main`.

`reef.grow.worker.TrainingWorker` launches torchrun with this module on this machine (and an
operator runs the same command on every other node, `docs/deploy.md`). Each rank joins the
process group (nccl on GPUs, gloo on the CPU) and builds its part of a `FullTrainer`. Rank 0
connects back to the worker (`REEF_TRAINER_ADDRESS`, on loopback, with the authkey in
`REEF_TRAINER_AUTHKEY`), receives each job, and broadcasts it to the other ranks over a gloo
group of its own; every rank runs it in lockstep, and only rank 0 answers. After each job the
ranks agree on whether it failed everywhere (a bad input: rank 0 answers the error and they go
on) or only somewhere (the ranks no longer hold the same state: all exit, the worker sees the
connection close and fails the job, and its next `start()` launches a fresh job).

A rank dies with its parent (torchrun), and torchrun ends the job when any rank exits, so a
killed rank, a killed torchrun and a killed Reef all end every rank.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import sys
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any, Sequence

ADDRESS_ENV = "REEF_TRAINER_ADDRESS"
AUTHKEY_ENV = "REEF_TRAINER_AUTHKEY"
COLLECTIVE_TIMEOUT_S = 600  # a rank stuck this long in a collective (a peer died mid-call) raises
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>; reef.serve.worker sets the same, a layer above this one


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is Reef's to handle; it stops us
    _die_with_parent()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    import torch.distributed as dist

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if cuda else None  # jobs travel as Python objects
    rank = dist.get_rank()
    conn = _connect() if rank == 0 else None
    try:
        from reef.grow.full_trainer import FullTrainer

        trainer = FullTrainer(Path(args.model_dir), args.threads, args.device, args.dtype, args.engine_dtype or None)
        error = None
    except Exception as exc:  # noqa: BLE001 - reported to the worker, which raises it
        trainer, error = None, f"{type(exc).__name__}: {exc}"
    if not _agree(error is None, control, everywhere=True) or trainer is None:
        if conn is not None:
            conn.send(("error", error or "another rank could not start"))
        return 1
    if conn is not None:
        conn.send(("ready", None))
    return _serve(trainer, conn, control)


def _serve(trainer: Any, conn: Connection | None, control: Any) -> int:
    """Answer jobs until told to stop: rank 0 reads each and broadcasts it; all run it."""
    import torch.distributed as dist

    from reef.grow.worker import METHODS

    while True:
        box: list[Any] = [None]
        if conn is not None:
            try:
                box[0] = conn.recv()
            except (EOFError, OSError):
                box[0] = ("stop", ())  # the worker is gone
        dist.broadcast_object_list(box, src=0, group=control)
        method, args = box[0]
        if method == "stop":
            os._exit(0)  # nothing to flush between jobs; teardown with torch loaded takes seconds
        try:
            if method not in METHODS:
                raise ValueError(f"unknown training job {method!r}")
            reply = ("ok", getattr(trainer, method)(*args))
        except Exception as exc:  # noqa: BLE001 - the worker raises it as TrainingFailed
            last = traceback.extract_tb(exc.__traceback__)[-1]
            reply = ("error", f"{type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})")
        failed = reply[0] == "error"
        everywhere = _agree(failed, control, everywhere=True)
        consistent = everywhere or not _agree(failed, control)  # all failed, or none did
        if conn is not None:
            if not consistent and not failed:
                reply = ("error", "a training rank failed the job; the ranks restart")
            try:
                conn.send(reply)
            except (OSError, ValueError):
                os._exit(1)
        if not consistent:
            os._exit(1)  # the ranks' states differ now: end the job, the worker starts a fresh one


def _agree(flag: bool, control: Any, everywhere: bool = False) -> bool:
    """Whether `flag` holds on every rank (`everywhere`: on all; else: on any)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([1 if flag else 0])
    dist.all_reduce(value, op=dist.ReduceOp.MIN if everywhere else dist.ReduceOp.MAX, group=control)
    return bool(value.item())


def _connect() -> Connection:
    host, port = os.environ[ADDRESS_ENV].rsplit(":", 1)
    return Client((host, int(port)), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGTERM to this rank when torchrun dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reef.grow.rank_main", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="the base model's folder (the same path on every node)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads of this rank (0: torch's default)")
    parser.add_argument("--device", default="auto", help="learner.device")
    parser.add_argument("--dtype", default="auto", help="learner.dtype")
    parser.add_argument("--engine-dtype", default="", help="the serving engine's dtype (learner.dtype auto on a GPU)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
