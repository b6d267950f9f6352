"""Run control: what a command works on and how its stages run, on one process or many.

* :mod:`~mmcore.run.session` — resolve the pack, its config and the run directory.
* :mod:`~mmcore.run.runner` — which stages are up to date, resuming, manifests.
* :mod:`~mmcore.run.rundir` — the run directory and its atomic manifests;
  :mod:`~mmcore.run.lock` — one run at a time in it; :mod:`~mmcore.run.status` — how far an
  unfinished stage got.
* Several processes: :mod:`~mmcore.run.preflight` (the layout, checked first),
  :mod:`~mmcore.run.launch` and :mod:`~mmcore.run.torchrun` (torchrun), :mod:`~mmcore.run.worker`
  and :mod:`~mmcore.run.worker_errors` (each process), :mod:`~mmcore.run.nodes` (several
  machines), :mod:`~mmcore.run.lifeline` (children end with their parent).
* Per-pack environments: :mod:`~mmcore.run.envs`, :mod:`~mmcore.run.env_requirements`.
"""
