"""One rank of a plan's execution: its stage's layers, the 1F1B schedule, the allreduces, Adam.

Rank order (Megatron / DeepSpeed): rank = tp_rank + tp*dp_rank + tp*dp*stage.
Per iteration, replica r takes samples [r*B/dp, (r+1)*B/dp) of the global batch
(synthetic tokens from a generator seeded by (seed, iteration)), in n = B/(dp*b)
micro-batches of b samples, through a non-interleaved 1F1B schedule (Narayanan et
al. 2021): stage s runs min(pp-s-1, n) forwards, then alternates one forward and
one backward, then drains the remaining backwards.  Activations go forward and
gradients backward with ``isend`` and a blocking ``recv``; an activation's send
is completed when its gradient comes back, a gradient's send before the next one
(at most one in flight).  Each micro-batch's loss is divided by n; after the schedule,
tied word-embedding gradients are all-reduced between the first and last stage
(Megatron-LM), then each stage's gradients are all-reduced over its dp replicas
(one flat buffer, averaged), then Adam steps.

Timed per rank and iteration (seconds, ``time.perf_counter``): the iteration
(after a barrier, to the end of the optimizer step), compute (forward + backward
of the stage's layers), p2p (time blocked in recv and in waiting for sends --
this includes pipeline bubbles: a stage waiting for its neighbour's compute is
blocked in recv), allreduce (dp gradients, with the flattening copies), tie
allreduce, tensor-parallel all-reduce inside the blocks, optimizer.

Memory: on CUDA ``torch.cuda.max_memory_allocated``.  On CPU there is no
allocator counter, so it is TRACKED: parameters + gradients + Adam's two moments
(element bytes of the model dtype) + the dp flat buffer + the peak over the
schedule of live saved activations (saved_tensors_hooks) plus pipeline buffers
(stage outputs held for backward, gradients received or being sent).  Each part's
peak is added: an upper bound on what is live at once, not an allocator figure.
A task's ``memory_limit`` (bytes, a stand-in for the device's memory) raises an
out-of-memory error once the tracked total exceeds it: the model state, the flat
buffer and the instance's memory reserve count first, then the activations and
pipeline buffers as they come.
"""

from __future__ import annotations

import time

from ..model.presets import ModelShape
from ..model.schedule import pipeline_order

from ._torch import require_torch
from .memory import SavedTensorTracker, tensor_bytes
from .modules import TensorParallel, build_model, run_layers, torch_dtype
from .profile import Timer
from .provenance import device_memory, provenance, set_threads

torch = require_torch()
import torch.distributed as dist  # noqa: E402


def synthetic_batch(shape: ModelShape, global_batch: int, seed: int, iteration: int):
    """(inputs, targets) token ids of one iteration, (global_batch, seq_len) each."""
    gen = torch.Generator().manual_seed(seed * 7919 + iteration)
    tokens = torch.randint(0, shape.vocab, (global_batch, shape.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class _Groups:
    """Every process group of the plan (all ranks create all groups, in one order)."""

    def __init__(self, tp: int, dp: int, pp: int, rank: int, tied: bool):
        def rank_of(j, r, s):
            return j + tp * r + tp * dp * s

        self.stage, self.dp_rank, self.tp_rank = rank // (tp * dp), (rank // tp) % dp, rank % tp
        self.tp = self.dp = self.tie = None
        for s in range(pp):
            for r in range(dp):
                ranks = [rank_of(j, r, s) for j in range(tp)]
                group = dist.new_group(ranks) if tp > 1 else None
                if rank in ranks:
                    self.tp = group
        for s in range(pp):
            for j in range(tp):
                ranks = [rank_of(j, r, s) for r in range(dp)]
                group = dist.new_group(ranks) if dp > 1 else None
                if rank in ranks:
                    self.dp = group
        if tied and pp > 1:
            for r in range(dp):
                for j in range(tp):
                    ranks = [rank_of(j, r, 0), rank_of(j, r, pp - 1)]
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        self.tie = group
        s, r, j = self.stage, self.dp_rank, self.tp_rank
        self.prev = rank_of(j, r, s - 1) if s > 0 else None
        self.next = rank_of(j, r, s + 1) if s < pp - 1 else None


class _Clock:
    def __init__(self):
        self.totals: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + seconds


class _Buffers:
    """Pipeline buffers (held outputs, received and in-flight tensors), each storage once,
    reported to the tracker as extra live bytes."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.refs: dict = {}

    @staticmethod
    def _key(tensor):
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()

    def add(self, tensor):
        key = self._key(tensor)
        if key not in self.refs:
            self.refs[key] = 0
            self.tracker.add_extra(key[1])
        self.refs[key] += 1
        return tensor

    def remove(self, tensor) -> None:
        key = self._key(tensor)
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.tracker.add_extra(-key[1])


def _word_grad(layers, stage: int, pp: int):
    if stage == 0 and "embedding" in layers:
        return layers["embedding"].word
    if stage == pp - 1 and "head" in layers:
        return layers["head"].weight
    return None


def run_worker(task: dict, rank: int, world: int) -> dict:
    """Execute the task's plan on this rank; rank 0 returns the gathered measurements."""
    shape = ModelShape(**task["model"])
    plan = task["plan"]
    tp, dp, pp, b = plan["tp"], plan["dp"], plan["pp"], plan["micro_batch"]
    device = task["device"]
    if device == "cuda":
        torch.cuda.set_device(int(task.get("local_rank", rank)) % torch.cuda.device_count())
    threads = set_threads(task["threads"])
    dtype = torch_dtype(task["dtype"])
    groups = _Groups(tp, dp, pp, rank, shape.tied_embeddings)
    s = groups.stage
    first, last = plan["partition"][s], plan["partition"][s + 1]
    tp_timer = Timer()
    layers = build_model(shape, layers=range(first, last), attention=task["attention"], dtype=dtype, device=device,
                         seed=task["seed"], tp=TensorParallel(tp, groups.tp_rank, groups.tp, tp_timer))
    params = list({id(p): p for p in layers.parameters()}.values())
    optimizer = torch.optim.Adam(params, lr=task["lr"])
    n = task["global_batch"] // (dp * b)
    hidden = (b, shape.seq_len, shape.hidden)
    has_head = "head" in layers
    word = _word_grad(layers, s, pp) if groups.tie is not None else None
    flat_bytes = sum(tensor_bytes(p) for p in params) if dp > 1 else 0
    state = sum(tensor_bytes(p) for p in params)
    # --memory-limit stands for the device's memory: parameters, gradients, two Adam moments, the
    # reduction buffer and the instance's reserve count toward it before any activation.
    tracker = SavedTensorTracker(exclude=[layers], limit=task.get("memory_limit"),
                                 reserved=4 * state + flat_bytes + int(task.get("memory_reserve", 0)))
    tracker.add_extra(0)  # the model state alone may exceed the limit
    buffers = _Buffers(tracker)
    schedule = [(kind, j) for kind, j, _ in pipeline_order(s, pp, n)]  # Megatron's 1F1B
    records, losses, grads_dump = [], [], None
    for it in range(task["warmup"] + task["iterations"]):
        inputs, targets = synthetic_batch(shape, task["global_batch"], task["seed"], it)
        lo = groups.dp_rank * n * b
        clock = _Clock()
        pending, sent, kept, loss_sum = [], {}, {}, 0.0
        dist.barrier()
        tp_before = tp_timer.total
        start = time.perf_counter()
        for kind, j in schedule:
            mb_targets = targets[lo + j * b: lo + (j + 1) * b].clone().to(device)  # own storage
            if kind == "F":
                if groups.prev is None:
                    x = inputs[lo + j * b: lo + (j + 1) * b].clone().to(device)
                else:
                    t0 = time.perf_counter()
                    x = torch.empty(hidden, dtype=dtype, device=device)
                    dist.recv(x, groups.prev)
                    clock.add("p2p", time.perf_counter() - t0)
                    x.requires_grad_()
                t0 = time.perf_counter()
                with tracker:
                    out = run_layers(layers, x, mb_targets)
                if has_head:
                    out = out / n
                    loss_sum += float(out.detach())
                else:
                    buffers.add(out)
                clock.add("compute", time.perf_counter() - t0)
                kept[j] = (x, out)
                if groups.next is not None:
                    t0 = time.perf_counter()
                    sent[j] = (dist.isend(out.detach(), groups.next), buffers.add(out.detach()))
                    clock.add("p2p", time.perf_counter() - t0)
            else:
                x, out = kept.pop(j)
                grad = None
                if groups.next is not None:
                    t0 = time.perf_counter()
                    grad = buffers.add(torch.empty(hidden, dtype=dtype, device=device))
                    dist.recv(grad, groups.next)
                    clock.add("p2p", time.perf_counter() - t0)
                t0 = time.perf_counter()
                torch.autograd.backward(out, grad)
                clock.add("compute", time.perf_counter() - t0)
                t0 = time.perf_counter()
                if grad is not None:
                    # its gradient came back, so the activation was received: finish that send
                    handle, tensor = sent.pop(j)
                    handle.wait()
                    buffers.remove(tensor)
                    buffers.remove(out)
                    buffers.remove(grad)
                del out, grad
                if groups.prev is not None:
                    if pending:  # at most one gradient in flight
                        handle, tensor = pending.pop()
                        handle.wait()
                        buffers.remove(tensor)
                    pending.append((dist.isend(x.grad, groups.prev), buffers.add(x.grad)))
                clock.add("p2p", time.perf_counter() - t0)
        t0 = time.perf_counter()
        for handle, tensor in pending + list(sent.values()):
            handle.wait()
            buffers.remove(tensor)
        del pending, sent, kept
        clock.add("p2p", time.perf_counter() - t0)
        if word is not None:
            t0 = time.perf_counter()
            dist.all_reduce(word.grad, group=groups.tie)
            clock.add("tie_allreduce", time.perf_counter() - t0)
        if dp > 1:
            t0 = time.perf_counter()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, group=groups.dp)
            flat /= dp
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            del flat
            clock.add("allreduce", time.perf_counter() - t0)
        if task.get("dump_grads") and it == 0:
            grads_dump = {f"{name}.{pname}": p.grad.detach().cpu().clone()
                          for name, module in layers.items() for pname, p in module.named_parameters()}
        t0 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.add("optimizer", time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        clock.add("tp_comm", tp_timer.total - tp_before)
        if it >= task["warmup"]:
            records.append({"iteration": elapsed, **clock.totals})
        losses.append(loss_sum if has_head else None)
    if grads_dump is not None:
        torch.save(grads_dump, f"{task['dump_grads']}/grads.{rank}.pt")
    memory = {"parameters": state, "gradients": state, "optimizer": 2 * state,
              "communication_buffers": flat_bytes, "activations_peak": tracker.peak}
    if device == "cuda":
        peak, kind = int(torch.cuda.max_memory_allocated()), "allocator"
    else:
        peak, kind = int(sum(memory.values())), "tracked"
    mine = {"rank": rank, "stage": s, "dp_rank": groups.dp_rank, "tp_rank": groups.tp_rank,
            "device": plan["stages"][s][groups.dp_rank][groups.tp_rank], "layers": [first, last],
            "records": records, "losses": losses, "peak_memory": peak, "memory_kind": kind, "memory": memory,
            "device_memory": device_memory(device, int(task.get("local_rank", rank)))}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return {"rank": rank}
    prov = provenance(device, dtype, threads, attention=task["attention"], processes=world,
                      backend=dist.get_backend(), warmup=task["warmup"], iterations=task["iterations"])
    from .record import assemble

    return {"record": assemble(plan, gathered, n=n, provenance=prov, tp=tp, memory_limit=task.get("memory_limit"))}
