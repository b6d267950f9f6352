"""``mmcore plan``: will a model fit a cluster, and how fast will it train, before renting it.

The model is built on ``meta`` from its config (:mod:`.model`); per-rank memory comes from its
parameter counts and an activation formula per block (:mod:`.activations`), for candidate
layouts (:mod:`.layouts`) on a device of :mod:`.devices`; the step's FLOPs are the train
engine's MFU accounting, called, not rewritten. :mod:`.measure` measures the same quantities on
a real step at CPU scale, so the formulas are checked (``tests/test_plan_measured.py``).
"""
