"""Calibrate the cost model from measured runs (``formulations/calibration.md``).

:mod:`.runs` reads RUNS.json, :mod:`.fit` fits the calibration section (C1-C8) with the
one evaluator predicting every run (:mod:`.predict`): :mod:`.params` the parameters,
:mod:`.lsq` the least squares, :mod:`.crossval` the cross-validation across groups,
:mod:`.scoring` the guard of each step, :mod:`.memory` the out-of-memory headroom,
:mod:`.report` the report; :mod:`.metrics` scores predictions.
Pure numpy: no PyTorch needed to calibrate.
"""
