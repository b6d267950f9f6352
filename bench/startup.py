"""Start-up: how long ``mmcore --help`` and ``mmcore list`` take, whether they import torch, and
(full run only) how long a per-pack environment takes to create with uv vs venv + pip.

* CLI: each repetition runs ``mmcore --help``, ``mmcore list`` and, as the yardstick,
  ``python -c "import torch"`` in fresh processes; the figure is the command's median wall time
  (goal < 1 s) with the torch import beside it. ``-X importtime`` tells whether torch was imported.
* Environments: ``mmcore env create --pack whisper --from packs/audio/whisper --engine uv`` and
  ``--engine pip``, each into a scratch env home, both after one untimed warm-up that fills the
  caches (pip's and uv's), so the figure is the install itself, not the download. Once each:
  a create takes minutes with pip.

    python bench/startup.py [--quick] [--reps 5] [--no-envs]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import emit, figure, parser, reps_of

REPO = Path(__file__).resolve().parent.parent
MMCORE = [sys.executable, "-m", "mmcore"]


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-1500:]}")
    return seconds


def imports_torch(args: list[str]) -> bool:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mmcore", *args], capture_output=True, text=True)
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in proc.stderr.splitlines())


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--no-envs", action="store_true", help="skip the environment creation figures")
    args = p.parse_args()
    reps = reps_of(args)
    torch_import = [sys.executable, "-c", "import torch"]
    for name, cli in (("help", ["--help"]), ("list", ["list"])):
        wall(MMCORE + cli)  # warm the page cache for both
        wall(torch_import)
        own, torch_s = [], []
        for rep in range(reps):
            for which in ("mmcore", "torch") if rep % 2 == 0 else ("torch", "mmcore"):
                (own if which == "mmcore" else torch_s).append(wall(MMCORE + cli if which == "mmcore" else torch_import))
        emit(
            figure(
                f"startup/mmcore-{name}",
                f"`mmcore {' '.join(cli)}` wall time (a fresh process)",
                "s",
                own,
                torch_s,
                baseline_name='python -c "import torch"',
                goal=("<=", 1.0),
                goal_of="mmcore",
                how=f"{reps} repetitions alternating with the torch import, warm page cache",
                imports_torch=imports_torch(cli),
            )
        )
    if args.quick or args.no_envs:
        return
    from mmcore.run.env_requirements import uv_binary

    if uv_binary() is None:
        print("# startup/env-create: not run, uv is not installed", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        seconds = {}
        for engine in ("uv", "pip"):
            for attempt in ("warm-up", "timed"):
                home = Path(tmp) / f"{engine}-{attempt}"
                env = {**os.environ, "MMCORE_HOME": str(home)}
                took = wall([*MMCORE, "env", "create", "--pack", "whisper", "--from", str(REPO / "packs/audio/whisper"), "--engine", engine], env=env)
                if attempt == "timed":
                    seconds[engine] = took
        emit(
            figure(
                "startup/env-create",
                "create the whisper pack's environment (mmcore + pack + deps, torch pinned)",
                "s",
                [seconds["uv"]],
                [seconds["pip"]],
                baseline_name="venv + pip",
                ratio_is="baseline/mmcore",
                how="`mmcore env create --engine uv` vs `--engine pip`, each after an untimed warm-up create (caches filled), one timed create each",
            )
        )


if __name__ == "__main__":
    main()
