"""Benchmarks of the solvers: instances (suites, files, folders, globs), jobs run as processes here or
on a Dask cluster, rows, the field's statistics (solved counts, shifted geometric means, performance
profiles, primal integrals, variability), writers and plan-quality baselines.
``python -m amp_opt bench`` is the command (:mod:`amp_opt.commands.bench`).
"""
