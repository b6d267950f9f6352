"""What a stage hook receives: everything about the run, nothing global."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, TypeVar

from mmcore.framework.console import progress as _progress
from mmcore.framework.console import say

if TYPE_CHECKING:
    from mmcore.framework.accelerator import Accelerator
    from mmcore.config import RunConfig
    from mmcore.framework.pack import PackSpec
    from mmcore.framework.plugins import Plugins

T = TypeVar("T")


@dataclass(frozen=True)
class WorldInfo:
    """This process's place among the processes of a stage (torchrun's environment variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WorldInfo":
        env = os.environ if env is None else env
        world_size = int(env.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world_size))),
            node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", "0"))),
        )

    @property
    def is_main(self) -> bool:
        """Rank 0 of the whole world: logs, metrics, progress bars."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Local rank 0 of each node: writes files to the node's run directory."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass
class StageContext:
    """The context of one stage of one run, handed to every stage and observer hook.

    Attributes:
        pack: The pack's name.
        spec: The pack's :class:`~mmcore.framework.pack.PackSpec`.
        stage: The stage's name.
        run_dir: The run directory (``runs/<name>``).
        stage_dir: Where this stage writes (``runs/<name>/<stage>``).
        config: The validated config (an instance of the pack's config class).
        world: This process's place among the stage's processes.
        resume: True when the stage was interrupted earlier with the same config and inputs:
            continue from what is in ``stage_dir`` instead of starting again.
        debug: The user asked for tracebacks and verbose output.
    """

    pack: str
    spec: PackSpec
    stage: str
    run_dir: Path
    stage_dir: Path
    config: RunConfig
    world: WorldInfo = field(default_factory=WorldInfo)
    resume: bool = False
    debug: bool = False
    plugins: Plugins | None = field(default=None, repr=False)
    _inputs: list[str] = field(default_factory=list, repr=False)
    _accelerator: Accelerator | None = field(default=None, repr=False)

    @property
    def seed(self) -> int:
        return self.config.run.seed

    @property
    def offline(self) -> bool:
        return self.config.run.offline

    @property
    def accelerator(self) -> Accelerator:
        """The accelerator ``run.device`` selects (``auto``: the best available)."""
        if self._accelerator is None:
            assert self.plugins is not None, "StageContext built without plugins"
            self._accelerator = self.plugins.registry.accelerator(self.config.run.device)
        return self._accelerator

    def kernel(self, name: str) -> Callable[..., Any]:
        """Kernel ``name`` for this run's device (its fused version if present, else the reference)."""
        assert self.plugins is not None
        return self.plugins.registry.kernel(name, self.accelerator.name)

    def record_input(self, path: str | os.PathLike[str]) -> None:
        """Declare a file or directory this stage read; a change to it reruns the stage."""
        self._inputs.append(str(Path(path).absolute()))

    @property
    def inputs(self) -> list[str]:
        return list(self._inputs)

    def log_metrics(self, step: int, metrics: Mapping[str, Any], *, wall_time: float | None = None) -> None:
        """Hand metrics to every metric sink (main process only). ``wall_time``: when they were
        measured (``time.time()``; default: now), for a caller that hands rows over later."""
        if self.world.is_main and self.plugins is not None:
            self.plugins.pm.hook.mmcore_log_metrics(ctx=self, step=step, metrics=dict(metrics), wall_time=time.time() if wall_time is None else wall_time)

    def resumed_metrics_at(self, step: int) -> None:
        """Training resumed from step ``step``'s checkpoint: every metric sink forgets what an
        interrupted attempt logged after it, so each step is logged once (main process only)."""
        if self.world.is_main and self.plugins is not None:
            self.plugins.pm.hook.mmcore_metrics_resumed(ctx=self, step=step)

    def say(self, message: str) -> None:
        """Print a line for the user (main process only)."""
        if self.world.is_main:
            say(message)

    def progress(self, items: Iterable[T], *, total: int | None = None, description: str = "", unit: str = "it") -> Iterator[T]:
        """A progress bar over ``items`` on the main process; plain iteration elsewhere."""
        return _progress(items, total=total, description=description or self.stage, unit=unit, enabled=self.world.is_main)
