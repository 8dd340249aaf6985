"""Benchmarks of the solvers: suites of instances, runs in child processes, rows, writers and
plan-quality baselines.  ``python -m amp_opt bench`` is the command (:mod:`amp_opt.commands.bench`).
"""
