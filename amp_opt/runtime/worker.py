"""Worker entry point: one rank of a profiling, link-measuring or plan-execution task.

torchrun-compatible: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
come from the environment, so across nodes::

    torchrun --nnodes 2 --nproc-per-node 4 ... -m amp_opt.runtime.worker --task task.json --out results/

Each rank writes ``result.<rank>.json`` into ``--out``; rank 0's holds the
assembled record (every rank's measurements gathered).  Exit status: 0 done,
3 out of memory (``{"failed": "oom"}`` written), 1 any other error
(``{"failed": "error", "error": ...}`` written, traceback on stderr).
A task may carry a ``fault`` ({"rank", "how": "raise" | "kill" | "hang"}): a
testing hook that makes that rank fail on purpose.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

EXIT_OOM = 3


def _fault(task: dict, rank: int) -> None:
    fault = task.get("fault")
    if not fault or fault.get("rank") != rank:
        return
    how = fault.get("how")
    if how == "raise":
        raise RuntimeError(f"fault injected on rank {rank}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        while True:
            time.sleep(1)


def _write(out: Path, rank: int, result: dict) -> None:
    tmp = out / f"result.{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / f"result.{rank}.json")


def _device_memory(task: dict) -> int | None:
    """The memory of this rank's GPU for a failure result (None on CPU or when it cannot be read)."""
    try:
        from .provenance import device_memory

        return device_memory(task.get("device", "cpu"), int(task.get("local_rank", 0)))
    except Exception:  # noqa: BLE001 - a failure report must not fail
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amp_opt.runtime.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, help="task JSON file")
    parser.add_argument("--out", default=".", help="folder for result.<rank>.json")
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)  # a crash in C++ still shows the Python stack
    task = json.loads(Path(args.task).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    task["local_rank"] = int(os.environ.get("LOCAL_RANK", rank))  # the GPU of this rank on its node
    try:
        from ._torch import require_torch

        require_torch()  # a clear error without PyTorch
        import torch.distributed as dist

        backend = "nccl" if task.get("device") == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(task.get("collective_timeout", 300))))
        _fault(task, rank)
        if task["kind"] == "profile":
            from .profile import profile_worker

            result = profile_worker(task, rank, world)
        elif task["kind"] == "links":
            from .links import links_worker

            result = links_worker(task, rank, world)
        elif task["kind"] == "run":
            from .pipeline import run_worker

            result = run_worker(task, rank, world)
        else:
            raise ValueError(f"unknown task kind {task['kind']!r}")
        _write(out, rank, result)
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a result and an exit status
        from .profile import is_oom

        oom = is_oom(exc)
        _write(out, rank, {"failed": "oom" if oom else "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
                           "rank": rank, "device_memory": _device_memory(task)})
        traceback.print_exc(file=sys.stderr)
        return EXIT_OOM if oom else 1


def _exit(code: int) -> None:
    """Leave without the interpreter's teardown.

    The result is on disk by now; PyTorch's C++ static destructors (gloo's
    threads) occasionally abort the process at teardown ("terminate called
    without an active exception", about 1 run in 30 here), which would turn a
    finished run into a failed one.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
