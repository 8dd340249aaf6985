"""The problem and its price: instances, plans, candidates, layer times and the cost models.

Flow: :mod:`.load` reads an instance (:mod:`.instance` records; :mod:`.presets`,
:mod:`.hf_config` and :mod:`.catalog` fill it in) -> :mod:`.candidates` lists the
(tp, dp, pp, micro-batch) search space -> :mod:`.costs` prices the stages of a plan
(:mod:`.profiles` and :mod:`.tables` give the per-layer numbers, :mod:`.ranges` the
per-range tables and the DP kernel) -> :mod:`.evaluate` is the one evaluator.
"""
