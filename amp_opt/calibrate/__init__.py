"""Calibrate the cost model from measured runs (``formulations/calibration.md``).

:mod:`.runs` reads RUNS.json, :mod:`.fit` fits the calibration section (C1-C8)
with the one evaluator predicting every run, :mod:`.metrics` scores predictions.
Pure numpy: no PyTorch needed to calibrate.
"""
