"""Measured next to predicted, term by term, for one plan.

The hetero cost model's terms (``formulations/hetero.md``) and what the runtime
measures for them (seconds per iteration unless stated):

=================  =====================================  ==========================================
term               predicted (Evaluation)                 measured (run record)
=================  =====================================  ==========================================
E_s (H1)           ``stages[s].compute``, one micro-batch  ``compute_per_micro_batch`` (forward +
                                                          backward of one micro-batch, slowest rank)
P_s (H3)           ``stages[s].p2p``, one transfer         ``p2p`` per iteration: time blocked in
                                                          send/recv, bubbles included (not comparable
                                                          one to one; given for calibration)
AR_s (H4)          ``stages[s].allreduce`` less            ``allreduce`` (+ ``tie_allreduce``, which H4
                   ``optimizer_step``                      does not model)
O_s (H15)          ``stages[s].optimizer_step``            ``optimizer``
peak_s (C5')       ``peak_of_stage``: ``stages[s].memory``  ``peak_memory`` (tracked on CPU)
                   less the reserve, plus the calibrated
                   ``memory_overhead`` (eq. C5' of
                   formulations/calibration.md)
time (H13)         ``predicted_time``                      ``iteration_time`` (median)
=================  =====================================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TermPair:
    """One term: measured and predicted values (seconds or bytes) and measured / predicted."""

    measured: float
    predicted: float

    @property
    def ratio(self) -> float | None:
        return self.measured / self.predicted if self.predicted else None

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "predicted": self.predicted, "ratio": self.ratio}


@dataclass(frozen=True)
class StageComparison:
    stage: int
    layers: tuple[int, int]
    compute_per_micro_batch: TermPair
    p2p: TermPair
    allreduce: TermPair
    memory: TermPair
    optimizer: TermPair = TermPair(0.0, 0.0)  # the optimizer step (H15)
    pipeline: int | None = None  # a plan of several pipelines: the stage's pipeline


@dataclass(frozen=True)
class Comparison:
    """A run's measurements against the cost model's prediction for the same plan."""

    cost_model: str
    iteration_time: TermPair
    stages: tuple[StageComparison, ...]
    breakdown_predicted: dict[str, float]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "cost_model": self.cost_model,
            "iteration_time": self.iteration_time.to_json(),
            "stages": [{**({} if s.pipeline is None else {"pipeline": s.pipeline}), "stage": s.stage,
                        "layers": list(s.layers),
                        **{k: getattr(s, k).to_json() for k in ("compute_per_micro_batch", "p2p", "allreduce",
                                                                 "memory")}} for s in self.stages],
            "breakdown_predicted": dict(self.breakdown_predicted),
            "notes": list(self.notes),
        }


def compare_run(record: dict, evaluation, instance) -> Comparison:
    """Pair a successful run record with the Evaluation of the same plan.

    ``instance`` is the (calibrated) instance the plan was evaluated on: a stage's predicted
    memory is the allocator peak the model predicts for it (eq. C5',
    :func:`amp_opt.calibrate.predict.peak_of_stage`), the figure ``run`` prints and the
    calibration fits.

    Examples
    --------
    >>> from amp_opt import evaluate  # doctest: +SKIP
    >>> compare_run(record, evaluate(instance, plan, "hetero"), instance).iteration_time.ratio  # doctest: +SKIP
    """
    from ..errors import InputError

    if record.get("failed"):
        raise InputError("record", f"the run failed ({record['failed']}): nothing measured to compare")
    measured = record["measured"]
    n_micro = evaluation.n_micro if isinstance(evaluation.n_micro, int) else list(evaluation.n_micro)
    if measured["micro_batches_per_iteration"] != n_micro or len(measured["stages"]) != len(evaluation.stages):
        raise InputError("record", "the run and the evaluation are not of the same plan")
    from ..calibrate.predict import peak_of_stage

    stages = []
    for m, p in zip(measured["stages"], evaluation.stages):
        stages.append(StageComparison(
            stage=m["stage"], layers=tuple(m["layers"]),
            compute_per_micro_batch=TermPair(m["compute_per_micro_batch"], p.compute),
            p2p=TermPair(m["p2p"], p.p2p),
            allreduce=TermPair(m["allreduce"] + m.get("tie_allreduce", 0.0), p.allreduce - p.optimizer_step),
            optimizer=TermPair(m.get("optimizer", 0.0), p.optimizer_step),
            memory=TermPair(float(m["peak_memory"]), peak_of_stage(instance, p)), pipeline=p.pipeline))
    # the record's own p2p note is said again below, with what the prediction counts
    notes = [n for n in measured.get("notes", ()) if not n.startswith("p2p is time blocked")]
    if len(stages) > 1:
        notes.append("measured p2p is blocked time per iteration (bubbles included); predicted p2p is one transfer")
    if evaluation.pipelines:
        notes.append("with several pipelines a faster pipeline's measured allreduce includes its wait for the "
                     "slowest (the rings start once every pipeline holding their layers is done, U6); the term "
                     "by term split counts the pipeline that waits least")
    tied = [m["stage"] for m in measured["stages"] if m.get("tie_allreduce", 0.0) > 0]
    if tied and evaluation.pipelines:
        notes.append("measured allreduce of the stages holding the tied word embedding includes its sums within "
                     "and across the pipelines, which the cost model does not count")
    elif tied:
        notes.append(f"measured allreduce of stages {', '.join(map(str, tied))} includes the allreduce of the tied "
                     "word embedding between the first and last stage, which the cost model does not count "
                     "(so a stage without replicas shows one)")
    notes.append("predicted peak memory: the stage's modelled memory less the memory_reserve, plus the calibrated "
                 "memory_overhead (eq. C5')")
    return Comparison(evaluation.cost_model, TermPair(record["iteration_time"], evaluation.predicted_time),
                      tuple(stages), dict(evaluation.breakdown), tuple(notes))
