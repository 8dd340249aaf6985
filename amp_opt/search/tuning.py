"""The constants that steer the search, in one place, each with its reason.

None of them changes what a search proves or returns when it runs to the end: they decide
how the time limit is shared and how much work a step may take, so they decide what a
time-limited run reaches.  ``formulations/mip.md``, "Time", states the shares as a table and
what each was measured against; the result files named below hold the measurements.

Constants that define what is exact stay with their rule: ``SAME`` in :mod:`.result`, the
solvers' tolerances in :mod:`.mip.highs` and :mod:`.mip.backends`.  Limits that define the plan
space stay where ``formulations/exactness.md`` cites them (``MAX_SETS`` in :mod:`.device_sets`,
``MAX_CHUNKINGS`` in :mod:`amp_opt.model.candidates`).
"""

# ---- The clock (:mod:`.clock`) ---------------------------------------------------------------

# Seconds kept after the search for re-scoring the plans and writing them: a share of the limit,
# at most a quarter of a second (taken once, from the caller's limit).
RESERVE = (0.05, 0.25)

# ---- Sets of devices (idle GPUs, :mod:`.subsets`) --------------------------------------------

# Of the time limit: the whole cluster's search, when other sets remain.  No single share fits
# every instance: with 0.3 seed 11 of the generated 1024-GPU instances was proven optimal but
# seed 17's gap grew from 7% to 26% and seed 8's from 0.01% to 9.6%
# (benchmarks/results/gap_1024_today.md).
FIRST_SHARE = 0.6
# Time left worth a second run on a set not proven yet (seconds).
REVISIT_SECONDS = 1.0
# Rounds over the sets not proven yet, sharing the time left.
REVISIT_PASSES = 2
# A set run again gets at least this times its last run's seconds (if left): a run builds its
# programs again, so one no longer than the last would end near where it ended.
DEEPEN = 4.0

# ---- Blocks of layers (:mod:`.blocks`) -------------------------------------------------------

# Seconds per original layer kept back from the coarse search for re-scoring its plans and the
# bound on the original layers (0.3 s at 10^5 layers; benchmarks/results/time_limits.md, the
# rows of 10^5 layers).
REMAP_SECONDS_PER_LAYER = 5e-6

# ---- The MIP driver's phases (:mod:`.mip.driver`) --------------------------------------------

# Of the time left: phase 1 (DP incumbents) stops there once it has a plan.
P1_SHARE = 0.4
# The same when phase 1b runs: its plans beat the DP's fixed node orders on mixed clusters.
P1_KINDS_SHARE = 0.15
# Of the time left: phase 1's quick kind bounds stop there.
P1_QUICK_SHARE = 0.25
# Of the time left: the candidates' first bounds stop there.  The 4044 candidates of a generated
# 1024-GPU instance take about 6 s of B3: under --time-limit 5 they left no time for a plan
# (formulations/mip.md, "Time", the row "candidate bounds").
BOUNDS_SHARE = 0.5
# Of a candidate's share in phase 2: what a round of its kind bound may take before its program
# (unbounded, the kind bound took 15 s of the 32-node s0256-gpt3-13b-3types to prove what its
# program proves at once; formulations/mip.md, "Time").
KIND_FIRST = 0.5
# Phase 2: a candidate's share is PROGRAM_SHARE x (time left) / (open candidates), at least
# PROGRAM_FLOOR seconds and at most what is left: the first ones get a bit more.
PROGRAM_SHARE = 1.5
PROGRAM_FLOOR = 0.05
# A solver handed a program gets at least this many seconds, even when its share went on the build.
SOLVER_FLOOR = 0.01

# ---- Phase 1b, the stage-kind search (:mod:`.kinds.refine`) ----------------------------------

# Nodes from which phase 1b runs: below, the programs alone are exact in well under a second.
KIND_MIN_NODES = 8
# Rounds of bound refinement and plan building (eq. B4, K6); more while they pay.
KIND_ROUNDS = 4
# Relative move of the best plan or the weakest bound that pays for another round.
KIND_PROGRESS = 1e-4
# Share of the time left that phase 1b may spend (the programs get the rest); 0.75 until the
# programs on 1024 GPUs were seen to prove nothing in the fractions of a second they got.
KIND_SHARE = 0.9
# Share of a round's time left that raising bounds may take before plans are built.
BOUND_SHARE = 0.5
# DP paths per candidate and round for the Lagrangian kind bound.
KIND_SWEEPS = 400
# Candidates (lowest bounds first) that get plans built per round.
POLISHED = 3
# DP paths of the kind bound before a candidate's first incumbent.
QUICK_SWEEPS = 60
# Share of the search's time that one such quick bound may take.
QUICK_SHARE = 0.01
# Threshold cells (the weakest) at which an incumbent is re-partitioned.
POLISH_CELLS = 3
# Share of phase 1b's time in which, while plans improve, only the leading candidates are worked
# on: on the generated 1024-GPU instance of seed 8 it took the gap after 60 s from 10% to under 1%
# (benchmarks/results/gap_1024_today.md).
PLANS_FIRST = 0.5

# ---- The kind bound and its plans (:mod:`.kinds.bound`, :mod:`.kinds.construct`, :mod:`.kinds.lagrangian`)

# Milliseconds one dual step's LP may take (a guard; it takes about one).
LP_MS = 2000
# Relative width below which a cell is not split (its bound is final); under SAME of the driver.
FINEST = 1e-7
# Largest trust-region radius, in multiples of the target (seconds per group).
REACH = 10.0
# Threshold cells whose duals are raised together, in one batched DP sweep.
WAVE = 8
# Kinds of stage (non-empty sets of node classes) the kind bound handles: 6 node classes; more
# and the bound falls back to eq. B2/B3.
MAX_KINDS = 63
# Array operations one polish may spend by default (a few seconds).
POLISH_WORK = 2e9
# Array operations per second the multiset DP is assumed to run at before it has run (measured
# on a 2-core AMD EPYC it ran at 0.6-2.7e8, so this rate is only a start: Pace measures it).
POLISH_RATE = 5e8

# ---- The enumerator and auto's choice (:mod:`.free_grouping`, :mod:`.route`) ----------------------

# Transitions of one candidate's free-grouping walk past which the enumerator gives up.
MAX_TRANSITIONS = 50_000
# Transitions between two looks at the stop callback.
STOP_EVERY = 512
# States per counted multiset (the previous stage's node and link); measured: 0.3x to 3.5x of
# the count without it on the paper and 64-GPU instances.
FLAG_FACTOR = 4.0
# DP cells (transitions x ranges of a stage) the enumerator may take under auto.
AUTO_CELLS = 5e8
# Tensor-parallel groups above which auto's count is not even computed (CP-SAT at once).
MAX_GROUPS = 4096

# ---- The backends (:mod:`.mip.backends`, :mod:`.mip.highs`) ----------------------------------

# Seconds (at most a tenth of its budget) CBC stops early to write its solution.
CBC_WRITE_S = 1.0
# Seconds CBC gets at least once its program is written (it is killed at them).
CBC_FLOOR = 0.1
# Seconds HiGHS may take past its deadline before the caller stops waiting for it: the presolve
# of a heuristic's sub-MIP has no callback and ran more than 45 s past the limit
# (benchmarks/results/formulations.md, "Three MIP engines").
GRACE = 0.1
