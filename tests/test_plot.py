"""plot: the pipeline simulation (1F1B and interleaved) obeys its dependencies; the image is written."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import INSTANCES

import amp_opt
from amp_opt.model.plan import parse_plan
from amp_opt.model.schedule import FORWARD_SHARE, path_bound, pipeline_order, simulate


def simulate_1f1b(compute, p2p, allreduce, n):
    """The non-interleaved simulation (one chunk per stage; the wrap-around link unused)."""
    return simulate([[c] for c in compute], list(p2p[:-1]) + [0.0], allreduce, n)


def one_f_one_b_order(stage, pp, n):
    return [(k, i) for k, i, _ in pipeline_order(stage, pp, n)]

PLAN = {"tp": 1, "dp": 4, "pp": 4, "micro_batch": 1, "partition": [0, 7, 14, 20, 30]}
CASES = [
    ([1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 0.1, 0.0], [0.2, 0.2, 0.2, 0.2], 8),
    ([0.3, 1.2, 0.5, 0.9], [0.05, 0.2, 0.01, 0.0], [0.4, 0.1, 0.3, 0.2], 5),
    ([0.7, 0.2], [0.3, 0.0], [0.0, 0.5], 1),
    ([0.5], [0.0], [0.1], 3),
    ([0.2, 0.4, 0.1, 0.3, 0.6, 0.2], [0.01] * 5 + [0.0], [0.05] * 6, 2),  # fewer micro-batches than stages
]


@pytest.mark.parametrize("compute, p2p, allreduce, n", CASES)
def test_schedule_dependencies(compute, p2p, allreduce, n):
    sched = simulate_1f1b(compute, p2p, allreduce, n)
    pp = len(compute)
    op = {(o.kind, o.stage, o.micro): o for o in sched.ops}  # one chunk: the chunk index is 0
    eps = 1e-12
    for s in range(pp):
        for i in range(n):
            f, b = op[("F", s, i)], op[("B", s, i)]
            assert f.end - f.start == pytest.approx(compute[s] * FORWARD_SHARE)
            assert b.end - b.start == pytest.approx(compute[s] * (1 - FORWARD_SHARE))
            if s > 0:  # forward of i starts after the previous stage's forward of i plus p2p
                assert f.start >= op[("F", s - 1, i)].end + p2p[s - 1] - eps
            if s < pp - 1:  # backward of i starts after the next stage's backward of i plus p2p
                assert b.start >= op[("B", s + 1, i)].end + p2p[s] - eps
            assert b.start >= f.end - eps
        # the stage runs its 1F1B order, one op at a time
        seq = [op[(k, s, i)] for k, i in one_f_one_b_order(s, pp, n)]
        assert all(a.end <= c.start + eps for a, c in zip(seq, seq[1:]))
        ar = op[("allreduce", s, -1)]
        assert ar.start >= seq[-1].end - eps
    # valid lower bounds: stage m cannot start before micro-batch 0's forward reaches it, does n E_m of
    # work, and its last backward still has to travel back through the stages before it
    assert sched.makespan >= max(n * compute[m] + sum(compute[:m]) for m in range(pp)) - eps
    assert sched.makespan >= sum(compute) - eps
    if compute[-1] == max(compute):  # then that bound is the cost model's (n-1) max E + sum E
        assert sched.makespan >= (n - 1) * max(compute) + sum(compute) - eps
    assert sched.makespan == pytest.approx(max(o.end for o in sched.ops))
    # the critical path is a chain of ops ending at the makespan and starting at time 0
    path = [op[k[:3]] for k in sched.critical]
    assert max(o.end for o in path) == pytest.approx(sched.makespan)
    assert min(o.start for o in path) == 0.0


def test_model_compute_terms_are_not_a_bound_in_general():
    """(n-1) max E + sum E assumes the bottleneck stage idles while later stages work; under 1F1B
    a bottleneck stage in the middle fills that wait with backward work, so a schedule can beat it."""
    compute = [0.2, 0.4, 0.1, 0.3, 0.6, 0.2]
    sched = simulate_1f1b(compute, [0.0] * 6, [0.0] * 6, 2)
    assert sched.makespan < (2 - 1) * max(compute) + sum(compute)
    uniform = simulate_1f1b([0.5] * 4, [0.0] * 4, [0.0] * 4, 8)
    assert uniform.makespan == pytest.approx(7 * 0.5 + 4 * 0.5)  # equal stages: exactly the formula



@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=7), st.integers(1, 16))
def test_closed_formula_bounds_the_one_f_one_b_schedule(compute, n):
    """Without p2p, H6's (n-1) max E + sum E is never below the 1F1B schedule of the same stage
    times (what the schedule saves is the wait it assumes: benchmarks/results/calibration.md), and
    with a last stage as slow as any it is the schedule's makespan."""
    pp = len(compute)
    closed = (n - 1) * max(compute) + sum(compute)
    sched = simulate_1f1b(compute, [0.0] * pp, [0.0] * pp, n)
    assert sched.makespan <= closed * (1 + 1e-9)
    if compute[-1] == max(compute):
        assert sched.makespan == pytest.approx(closed)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 10.0), st.floats(0.0, 2.0)), min_size=1, max_size=7),
       st.integers(1, 16))
def test_path_bound_is_below_the_one_f_one_b_schedule(stages, n):
    """The two path families are paths of the 1F1B dependency graph, so their longest is never
    above the simulated makespan (p2p included); without p2p it is never above H6, and with the
    last stage as slow as any (where H6 is the schedule) it is the makespan."""
    compute, p2p = [c for c, _ in stages], [t for _, t in stages]
    pp = len(compute)
    bound = path_bound(compute, p2p, n)
    assert bound <= simulate_1f1b(compute, p2p, [0.0] * pp, n).makespan * (1 + 1e-9)
    sched = simulate_1f1b(compute, [0.0] * pp, [0.0] * pp, n).makespan
    bound = path_bound(compute, [0.0] * pp, n)
    assert bound <= sched * (1 + 1e-9) <= ((n - 1) * max(compute) + sum(compute)) * (1 + 2e-9)
    assert bound >= n * max(compute) * (1 - 1e-9)
    if compute[-1] == max(compute):
        assert bound == pytest.approx(sched)


def test_path_bound_sees_a_slow_first_stage_keep_busy():
    """Where H6 charges the round trip in full, the a family finds the busy first stage (the
    pipelined study plans with 2 micro-batches, benchmarks/results/calibration.md, in small)."""
    assert path_bound([3.0, 1.0], [0.0, 0.0], 2) == pytest.approx(6.0)
    assert simulate_1f1b([3.0, 1.0], [0.0, 0.0], [0.0, 0.0], 2).makespan == pytest.approx(6.0)
    # H6 charges 1 * 3 + 4 = 7.  The b family: a slow middle stage after its first backward
    # (6 + 3 backwards of 2 + 2 forwards of 1 = 14, where a gives 13 and H6 15)
    assert path_bound([1.0, 3.0, 2.0], [0.0] * 3, 4) == pytest.approx(14.0)
    assert simulate_1f1b([1.0, 3.0, 2.0], [0.0] * 3, [0.0] * 3, 4).makespan == pytest.approx(14.0)


@pytest.mark.parametrize("pp, v, n", [(2, 2, 2), (2, 2, 4), (4, 2, 8), (3, 3, 6), (4, 4, 4)])
def test_interleaved_schedule(pp, v, n):
    """Megatron's interleaved order runs every (micro-batch, chunk) forward and backward once, obeys
    the chunk dependencies (wrapping from the last stage to the first), and with equal chunks and free
    links takes (n - 1/v) max E + (1/v) sum E, the cost model's formula (eq. H11)."""
    E = 1.0
    sched = simulate([[E / v] * v for _ in range(pp)], [0.0] * pp, [0.0] * pp, n)
    op = {(o.kind, o.stage, o.micro, o.chunk): o for o in sched.ops}
    for s in range(pp):
        order = pipeline_order(s, pp, n, v)
        assert sorted(order) == sorted((k, i, c) for k in "FB" for i in range(n) for c in range(v))
    eps = 1e-12
    for (kind, s, i, c), o in op.items():
        if kind == "F" and (s, c) != (0, 0):
            prev = op[("F", s - 1, i, c)] if s > 0 else op[("F", pp - 1, i, c - 1)]
            assert o.start >= prev.end - eps
        if kind == "B":
            nxt = (op[("B", s + 1, i, c)] if s < pp - 1 else
                   op[("B", 0, i, c + 1)] if c < v - 1 else op[("F", s, i, c)])
            assert o.start >= nxt.end - eps
    assert sched.makespan == pytest.approx((n - 1 / v) * E + pp * E / v)


def test_one_f_one_b_order():
    assert one_f_one_b_order(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b_order(2, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert one_f_one_b_order(0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert one_f_one_b_order(1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_render_writes_file(tmp_path, suffix):
    pytest.importorskip("matplotlib")
    from amp_opt.commands.plot import render

    inst = amp_opt.load_instance(INSTANCES / "amp_het_cluster.json")
    ev = amp_opt.evaluate(inst, parse_plan(PLAN))
    target = tmp_path / f"timeline.{suffix}"
    sched = render(inst, ev, str(target))
    assert target.exists() and target.stat().st_size > 1000
    assert sched.makespan > 0


def test_cli(tmp_path):
    pytest.importorskip("matplotlib")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    inst = str(INSTANCES / "amp_het_cluster.json")
    out = subprocess.run([sys.executable, "-m", "amp_opt", "plot", inst, str(plan), "-o", str(tmp_path / "t.png")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "simulated schedule" in out.stdout and (tmp_path / "t.png").stat().st_size > 1000
    out = subprocess.run([sys.executable, "-m", "amp_opt", "plot", inst, str(plan), "-o", str(tmp_path / "t.pdf")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and ".png or .svg" in out.stderr


def test_missing_matplotlib_is_an_input_error(monkeypatch):
    import builtins

    from amp_opt.errors import InputError
    from amp_opt.commands.plot import _import_pyplot

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(InputError, match=r"amp_opt\[plot\]"):
        _import_pyplot()
