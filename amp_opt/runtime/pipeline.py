"""One rank of a plan's execution: its stage's layers, the 1F1B schedule, the allreduces, Adam
(its process groups and boundary peers: :mod:`.groups`).

Every stage s has its own tensor-parallel degree tp_s and dp_s replicas (:class:`.layout.Layout`);
ranks are stage by stage, rank = offset_s + tp_rank + tp_s*dp_rank (Megatron / DeepSpeed's order
when the plan is uniform).  Per iteration (synthetic tokens from a generator seeded by (seed,
iteration)) the global batch B is cut into n = B/M pipeline micro-batches of M samples; replica r
of stage s processes its share shares[s][r] of every one of them (``Layout.samples``), through a
non-interleaved 1F1B schedule (Narayanan et al. 2021): stage s runs min(pp-s-1, n) forwards, then
alternates one forward and one backward, then drains the remaining backwards.  The stage's blocks
recompute as the plan says (:func:`.modules.set_recompute`) and run sequence parallel if it says so.

Stage boundaries reshard: tensor-parallel rank j' of replica q of stage s+1 receives its samples,
piece by piece, from the replicas r of stage s whose sample ranges overlap its own (from their
tensor-parallel rank j' mod tp_s: a stage's output is whole on every tensor-parallel rank), and
sends the gradients of those pieces back to every tensor-parallel rank j of r with
j mod tp_{s+1} = j'.  A uniform plan exchanges with one peer, as Megatron does.  Sends are
``isend`` and receives a blocking ``recv``; an activation's sends are completed when its gradient
comes back, a gradient's sends before the next ones (one micro-batch in flight).

Each micro-batch's loss (mean over its tokens) is weighted by share/B, so the gradients summed
over a stage's replicas are those of the mean loss over the batch: after the schedule the tied
word-embedding gradient is summed between the first and last stage (Megatron-LM; each replica then
keeps 1/dp_s of it), then each stage sums its gradients over its dp_s replicas and Adam steps
(:mod:`.zero`: one flat all-reduce and Adam on every parameter, or under ZeRO-1 a reduce-scatter,
Adam on the rank's shard and an all-gather of the shards).

Several pipelines (``formulations/hetero.md`` U6; :func:`.layout.pipelines_of`): each runs the
above on its own samples of the batch (its n_i micro-batches of M_i), with its own groups; then,
instead of each stage's sum over its replicas, the gradients of each segment of the pipelines'
joint partition are summed over every replica holding it, rank by tensor-parallel rank (the
holders share one tp), and a tied word table over the first stages' and over the last stages'
ranks of every pipeline.  The losses are weighted by share/B with B the whole batch, so the sums
are the whole batch's gradients (``tests/test_runtime_pipelines.py`` checks them against one
process).

Timed per rank and iteration (seconds, ``time.perf_counter``): the iteration (after a barrier, to
the end of the optimizer step), compute (forward + backward of the stage's layers), p2p (time
blocked in recv and in waiting for sends -- this includes pipeline bubbles), allreduce (dp
gradients, with the flattening copies; under ZeRO-1 the reduce-scatter and the parameters'
all-gather), tie allreduce, tp_comm (the tensor-parallel collectives inside the blocks, recomputed
forwards' included, and the sequence-parallel parameters' gradient sum), optimizer.

Memory: on CUDA ``torch.cuda.max_memory_allocated``.  On CPU there is no allocator counter, so it
is TRACKED: the model state and reduction buffers (:mod:`.zero`) + the peak over the schedule of
live saved activations (saved_tensors_hooks, in forward and backward: what recomputation rebuilds
counts while its backward runs) plus pipeline buffers (stage outputs held for backward, gradients
received or being sent).  Each part's peak is added: an upper bound on what is live at once, not
an allocator figure.  A task's ``memory_limit`` (bytes, a stand-in for the device's memory) raises
an out-of-memory error once the tracked total exceeds it: the model state, the reduction buffers
and the instance's memory reserve count first, then the activations and buffers as they come.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..model.presets import ModelShape
from ..model.schedule import pipeline_order

from ._torch import require_torch
from .groups import Groups, Peer
from .layout import Layout, pipelines_of
from .memory import SavedTensorTracker
from .modules import ParallelLinear, TensorParallel, build_model, run_layers, set_recompute, torch_dtype
from .profile import Timer
from .provenance import device_memory, provenance, set_threads
from .zero import make_optimizer, sum_gradients

torch = require_torch()
import torch.distributed as dist  # noqa: E402


def synthetic_batch(shape: ModelShape, global_batch: int, seed: int, iteration: int):
    """(inputs, targets) token ids of one iteration, (global_batch, seq_len) each."""
    gen = torch.Generator().manual_seed(seed * 7919 + iteration)
    tokens = torch.randint(0, shape.vocab, (global_batch, shape.seq_len + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


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


@dataclass
class _Rank:
    """This rank's part of the plan: its layers, groups, optimizer, memory tracking."""

    task: dict
    shape: ModelShape
    lay: Layout
    groups: Groups
    layers: Any
    optimizer: Any  # a .zero optimizer: reduce, step, and the model state's memory parts
    tracker: Any
    buffers: _Buffers
    tp_timer: Timer
    dtype: Any
    device: str
    threads: int
    word: Any = None
    schedule: list = field(default_factory=list)
    plan: dict = field(default_factory=dict)  # this rank's pipeline's plan (the task's plan, or one of its pipelines)
    start: int = 0  # the pipeline's first sample in the iteration's batch
    pipes: tuple = ()  # the run's pipelines (:func:`.layout.pipelines_of`)

    @property
    def share(self) -> int:
        return self.lay.shares[self.groups.stage][self.groups.dp_rank]

    @property
    def rows(self) -> tuple[int, int]:
        return self.lay.samples(self.groups.stage, self.groups.dp_rank)


def _setup(task: dict, rank: int) -> _Rank:
    """Build this rank's layers, groups, optimizer and memory tracker."""
    shape = ModelShape(**task["model"])
    pipes = pipelines_of(task["plan"], global_batch=task["global_batch"])
    device = task["device"]
    if device == "cuda":
        torch.cuda.set_device(int(task.get("local_rank", rank)) % torch.cuda.device_count())
    threads = set_threads(task["threads"][rank] if isinstance(task["threads"], list) else task["threads"])
    dtype = torch_dtype(task["dtype"])
    groups = Groups(pipes, rank, shape.tied_embeddings)
    mine = pipes[groups.pipeline]
    lay, plan = mine.lay, mine.plan
    s = groups.stage
    tp_timer = Timer()
    layers = build_model(shape, layers=range(plan["partition"][s], plan["partition"][s + 1]),
                         attention=task["attention"], dtype=dtype, device=device, seed=task["seed"],
                         tp=TensorParallel(lay.tp[s], groups.tp_rank, groups.tp, tp_timer,
                                           sequence_parallel=bool(plan.get("sequence_parallel"))))
    mode = plan["recompute"] if isinstance(plan["recompute"], str) else plan["recompute"][s]
    set_recompute(layers, mode, first=plan.get("recompute_layers") or 0)
    params = list({id(p): p for p in layers.parameters()}.values())
    optimizer = make_optimizer(params, zero_stage=plan.get("zero_stage") or 0, replicas=lay.dp[s],
                               index=groups.dp_rank, group=groups.dp, lr=task["lr"])
    if groups.segments:  # several pipelines: a flat buffer per segment (or smaller piece), the largest live at once
        modules, first = list(layers.values()), plan["partition"][s]
        optimizer.memory["communication_buffers"] = max(
            sum(p.numel() * p.element_size() for p in {id(p): p for m in modules[a - first:b - first]
                                                        for p in m.parameters()}.values())
            for a, b, *_ in groups.segments)
    # --memory-limit stands for the device's memory: parameters, gradients, Adam's moments, the
    # reduction buffers and the instance's reserve count toward it before any activation.
    tracker = SavedTensorTracker(exclude=[layers], limit=task.get("memory_limit"),
                                 reserved=sum(optimizer.memory.values()) + int(task.get("memory_reserve", 0)))
    tracker.add_extra(0)  # the model state alone may exceed the limit
    word = groups.tie is not None or (shape.tied_embeddings and len(pipes) > 1)
    return _Rank(task, shape, lay, groups, layers, optimizer, tracker, _Buffers(tracker), tp_timer, dtype, device,
                 threads,
                 word=_word_grad(layers, s, lay.pp) if word else None,
                 schedule=[(kind, j) for kind, j, _ in pipeline_order(s, lay.pp, lay.n_micro)],  # Megatron's 1F1B
                 plan=plan, start=mine.start, pipes=pipes)


def _recv(me: _Rank, peers: list[Peer], tag: int, clock: _Clock, track: bool):
    """Receive the pieces of one micro-batch from ``peers`` (position order) as one tensor."""
    t0 = time.perf_counter()
    pieces = []
    for peer in peers:
        piece = torch.empty((peer.b - peer.a, me.shape.seq_len, me.shape.hidden), dtype=me.dtype, device=me.device)
        dist.recv(piece, peer.rank, tag=tag)
        pieces.append(me.buffers.add(piece) if track else piece)
    whole = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    if track and len(pieces) > 1:
        me.buffers.add(whole)
        for piece in pieces:
            me.buffers.remove(piece)
    clock.add("p2p", time.perf_counter() - t0)
    return whole


def _send(me: _Rank, tensor, peers: list[Peer], tag: int) -> list:
    """Start sending the pieces of ``tensor`` to ``peers``: [(handle, piece)], each piece tracked."""
    return [(dist.isend(tensor[p.a:p.b].contiguous(), p.rank, tag=tag), me.buffers.add(tensor[p.a:p.b]))
            for p in peers]


def _finish_sends(me: _Rank, sends: list) -> None:
    for handle, piece in sends:
        handle.wait()
        me.buffers.remove(piece)


def _forward(me: _Rank, j: int, inputs, targets, run: dict, clock: _Clock) -> None:
    """Micro-batch j forward: receive (or take) the input, run the stage, send the output on."""
    g, (a, b), m = me.groups, me.rows, me.lay.micro
    first = me.start + j * m  # the micro-batch's first sample in the iteration's batch
    mb_targets = targets[first + a: first + b].clone().to(me.device)  # own storage
    if g.prev is None:
        x = inputs[first + a: first + b].clone().to(me.device)
    else:
        x = _recv(me, g.prev[0], j, clock, track=False)
        x.requires_grad_()
    t0 = time.perf_counter()
    with me.tracker:
        out = run_layers(me.layers, x, mb_targets)
    if "head" in me.layers:
        out = out * (me.share / me.task["global_batch"])  # this micro-batch's part of the batch's mean loss
        run["loss"] += float(out.detach())
    else:
        me.buffers.add(out)
    clock.add("compute", time.perf_counter() - t0)
    run["kept"][j] = (x, out)
    if g.next is not None:
        t0 = time.perf_counter()
        run["sent"][j] = _send(me, out.detach(), g.next[0], j)
        clock.add("p2p", time.perf_counter() - t0)


def _backward(me: _Rank, j: int, run: dict, clock: _Clock) -> None:
    """Micro-batch j backward: receive the output's gradient, run backward, send the input's back."""
    g = me.groups
    x, out = run["kept"].pop(j)
    grad = _recv(me, g.next[1], j, clock, track=True) if g.next is not None else None
    t0 = time.perf_counter()
    with me.tracker:  # what recomputation rebuilds is saved during backward
        torch.autograd.backward(out, grad)
    clock.add("compute", time.perf_counter() - t0)
    t0 = time.perf_counter()
    if grad is not None:
        # its gradient came back, so the activation was received: finish those sends
        _finish_sends(me, run["sent"].pop(j))
        me.buffers.remove(out)
        me.buffers.remove(grad)
    del out, grad
    if g.prev is not None:
        _finish_sends(me, run["pending"])  # at most one micro-batch's gradients in flight
        run["pending"] = _send(me, x.grad, g.prev[1], j)
    clock.add("p2p", time.perf_counter() - t0)


def _reduce(me: _Rank, clock: _Clock) -> None:
    """The tied word embedding's gradient summed between the ends, then every gradient over the
    stage's replicas (all-reduced, or reduce-scattered under ZeRO-1: :mod:`.zero`); first, under
    sequence parallelism, the replicated parameters' gradients over the tensor-parallel group."""
    shared = [p for p in me.layers.parameters() if getattr(p, "sequence_parallel", False)]
    if shared:
        t0 = time.perf_counter()
        sum_gradients(shared, me.groups.tp)
        me.tp_timer.add(time.perf_counter() - t0)
    if me.word is not None and me.groups.tie is not None:
        t0 = time.perf_counter()
        s = me.groups.stage
        # Every tensor-parallel rank holds its replica's gradient whole: the sum over the ends' ranks,
        # each over its tp, is the whole gradient; each replica keeps 1/dp of it for the replicas' sum.
        if me.lay.tp[s] > 1:
            me.word.grad /= me.lay.tp[s]
        dist.all_reduce(me.word.grad, group=me.groups.tie)
        if me.lay.dp[s] > 1:
            me.word.grad /= me.lay.dp[s]
        clock.add("tie_allreduce", time.perf_counter() - t0)
    if me.groups.segments:
        _reduce_across(me, clock)
    else:
        me.optimizer.reduce(clock)


def _reduce_across(me: _Rank, clock: _Clock) -> None:
    """Several pipelines (U6): each segment's gradients summed over every replica holding it, in
    every pipeline; a tied word table over the first stages' and over the last stages' ranks of
    every pipeline (each rank's copy divided by its tp, as every tensor-parallel rank holds it whole;
    a rank that is both sums once and lends its copy to the other sum)."""
    word = me.word
    start = me.plan["partition"][me.groups.stage]
    modules = list(me.layers.values())
    t0 = time.perf_counter()
    for a, b, group, piece, pieces in me.groups.segments:
        params = list({id(p): p for module in modules[a - start:b - start] for p in module.parameters()
                       if p is not word}.values())
        if params and pieces == 1:
            sum_gradients(params, group)
        elif params:
            _sum_piece(modules[a - start:b - start], params, group, piece, pieces)
    clock.add("allreduce", time.perf_counter() - t0)
    if word is not None:
        t0 = time.perf_counter()
        first, last = me.groups.word_groups
        word.grad /= me.lay.tp[me.groups.stage]
        lent = word.grad.clone() if first is not None and last is not None else word.grad
        if first is not None:
            dist.all_reduce(word.grad, group=first)
        if last is not None:
            dist.all_reduce(lent, group=last)
        clock.add("tie_allreduce", time.perf_counter() - t0)


def _sum_piece(modules, params: list, group, piece: int, pieces: int) -> None:
    """Piece ``piece`` of ``pieces`` of this rank's shard of every sharded parameter, and every
    replicated parameter whole, summed over ``group`` (one rank per replica holding the segment, at
    any tp): a rank whose tp is ``pieces`` times below the finest reduces each piece in its own group,
    in piece order; its replicated gradients enter every one of them as they were and take the sum
    after the last."""
    cut = {id(p): (dim, index) for m in modules for sub in m.modules() if isinstance(sub, ParallelLinear)
           for p, dim, index in sub.pieces(piece, pieces)}
    parts = [p.grad.index_select(cut[id(p)][0], cut[id(p)][1]) if id(p) in cut else p.grad for p in params]
    flat = torch.cat([t.reshape(-1) for t in parts])
    dist.all_reduce(flat, group=group)
    offset = 0
    for p, part in zip(params, parts):
        got = flat[offset:offset + part.numel()].view_as(part)
        offset += part.numel()
        if id(p) in cut:
            p.grad.index_copy_(cut[id(p)][0], cut[id(p)][1], got)
        elif piece == pieces - 1:  # every group sums the same replicated gradients: kept after the last
            p.grad.copy_(got)


def _iteration(me: _Rank, it: int) -> tuple[dict, float | None, dict | None]:
    """One training iteration: (its times, its loss on the last stage, the gradients to dump)."""
    inputs, targets = synthetic_batch(me.shape, me.task["global_batch"], me.task["seed"], it)
    clock = _Clock()
    run = {"pending": [], "sent": {}, "kept": {}, "loss": 0.0}
    dist.barrier()
    tp_before = me.tp_timer.total
    start = time.perf_counter()
    for kind, j in me.schedule:
        if kind == "F":
            _forward(me, j, inputs, targets, run, clock)
        else:
            _backward(me, j, run, clock)
    t0 = time.perf_counter()
    _finish_sends(me, run["pending"] + [s for sends in run["sent"].values() for s in sends])
    clock.add("p2p", time.perf_counter() - t0)
    del run["kept"]
    _reduce(me, clock)
    dump = None
    if me.task.get("dump_grads") and it == 0:
        grads = me.optimizer.reduced_grads()
        dump = {f"{name}.{pname}": grads[id(p)].detach().cpu().clone()
                for name, module in me.layers.items() for pname, p in module.named_parameters()}
    me.optimizer.step(clock)
    elapsed = time.perf_counter() - start
    clock.add("tp_comm", me.tp_timer.total - tp_before)
    return {"iteration": elapsed, **clock.totals}, (run["loss"] if "head" in me.layers else None), dump


def run_worker(task: dict, rank: int, world: int) -> dict:
    """Execute the task's plan on this rank; rank 0 returns the gathered measurements."""
    me = _setup(task, rank)
    records, losses, grads_dump = [], [], None
    for it in range(task["warmup"] + task["iterations"]):
        record, loss, dump = _iteration(me, it)
        if it >= task["warmup"]:
            records.append(record)
        losses.append(loss)
        grads_dump = dump if dump is not None else grads_dump
    if grads_dump is not None:
        torch.save(grads_dump, f"{task['dump_grads']}/grads.{rank}.pt")
    return _gather(me, rank, world, records, losses)


def _gather(me: _Rank, rank: int, world: int, records: list, losses: list) -> dict:
    """Every rank's measurements to rank 0, which assembles the run record."""
    g, plan = me.groups, me.plan
    memory = {**me.optimizer.memory, "activations_peak": me.tracker.peak}
    if me.device == "cuda":
        peak, kind = int(torch.cuda.max_memory_allocated()), "allocator"
    else:
        peak, kind = int(sum(memory.values())), "tracked"
    s = g.stage
    mine = {"rank": rank, "pipeline": g.pipeline, "stage": s, "dp_rank": g.dp_rank, "tp_rank": g.tp_rank,
            "share": me.share,
            "threads": me.threads,
            "device": plan["stages"][s][g.dp_rank][g.tp_rank], "layers": plan["partition"][s:s + 2],
            "records": records, "losses": losses, "peak_memory": peak, "memory_kind": kind, "memory": memory,
            "device_memory": device_memory(me.device, int(me.task.get("local_rank", rank)))}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return {"rank": rank}
    prov = provenance(me.device, me.dtype, me.threads, attention=me.task["attention"], processes=world,
                      backend=dist.get_backend(), warmup=me.task["warmup"], iterations=me.task["iterations"])
    from .record import assemble, assemble_pipelines

    if len(me.pipes) > 1:
        return {"record": assemble_pipelines(me.task["plan"], gathered, pipes=me.pipes, provenance=prov,
                                             memory_limit=me.task.get("memory_limit"))}
    return {"record": assemble(plan, gathered, layout=me.lay, provenance=prov,
                               memory_limit=me.task.get("memory_limit"))}
