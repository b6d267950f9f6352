"""Registries filled through the registration hooks: accelerators, kernels, backends, rewards.

Everything here is importable without torch; implementations are named ``"module:attr"``
and imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from mmcore.framework.accelerator import Accelerator
from mmcore.errors import MmcoreError, UsageError

#: The pseudo-device of a kernel's reference implementation, used wherever no device kernel is.
REFERENCE = "reference"


def import_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    module_name, _, attr = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class KernelSpec:
    """One implementation of a kernel.

    Attributes:
        name: The kernel's name (``"rms_norm"``, ``"varlen_attention"``).
        device: ``"reference"`` for the portable implementation every kernel must have, or
            an accelerator name (``"cpu"``, ``"cuda"``, ``"npu"``).
        impl: ``"module:attr"`` of the callable. Imported only when the kernel is used.
        requires: Modules that must be importable for this implementation to be chosen
            (``("torch_npu",)``). Checked with ``find_spec``, never imported to check.
        summary: One line for ``mmcore info``.
        example: ``"module:attr"`` of a function returning a sample argument tuple (CPU
            tensors) for the reference; the conformance suite checks every implementation
            usable on the machine against the reference on it. Needed on the reference.
        wired: False for a kernel registered but not called by the pack's model yet
            (``mmcore info`` says so).
    """

    name: str
    device: str
    impl: str
    requires: tuple[str, ...] = ()
    summary: str = ""
    provider: str = ""
    example: str = ""
    wired: bool = True  # filled in by the core: the plugin that registered it

    def usable(self) -> bool:
        return all(_importable(mod) for mod in self.requires)

    def load(self) -> Callable[..., Any]:
        return import_object(self.impl)


@dataclass(frozen=True)
class BackendSpec:
    """A distributed training backend.

    Attributes:
        name: ``"fsdp2"``, ``"megatron"``, ...
        factory: ``"module:attr"`` of a callable that builds the backend object, one per
            train stage: a :class:`mmcore.backends.protocol.Backend`, which the train loop drives.
        summary: One line for ``mmcore info``.
    """

    name: str
    factory: str
    summary: str = ""
    provider: str = ""


#: what a reward function may score (``RewardSpec.takes``)
REWARD_KINDS = ("text", "image")


@dataclass(frozen=True)
class RewardSpec:
    """A reward function for online RL (``training.grpo.rewards: {name: weight}``).

    Attributes:
        name: what a config calls it (``"accuracy"``, ``"my_team.verifier"``).
        impl: ``"module:attr"`` of the function, imported when a run uses it. A ``text``
            reward is ``fn(completions, references, prompts) -> list[float]``: one float per
            completion (the answers as decoded text), ``references[i]`` the expected answer of
            completion ``i``'s prompt (None where the data gave none), ``prompts[i]`` that
            prompt's last user turn. An ``image`` reward is ``fn(images, prompts) ->
            list[float]``: one float per generated sample, ``images[i]`` its decoded frames as
            a numpy float32 array [F, H, W, 3] in [0, 1] (a picture is one frame), ``prompts[i]``
            its caption. Both are called with keyword arguments and more may come (``**kwargs``).
        summary: One line for ``mmcore info``.
        takes: what it scores: ``"text"`` (a VLM's answers, the default) or ``"image"`` (a
            diffusion model's pictures and videos); a run refuses a reward of the other kind.
    """

    name: str
    impl: str
    summary: str = ""
    provider: str = ""
    takes: str = "text"

    def load(self) -> Callable[..., Any]:
        return import_object(self.impl)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@dataclass
class Registry:
    """Everything the registration hooks provided, checked for clashes."""

    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    kernels: dict[tuple[str, str], KernelSpec] = field(default_factory=dict)
    kernel_providers: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    backends: dict[str, BackendSpec] = field(default_factory=dict)
    rewards: dict[str, RewardSpec] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    # -- filling
    def add_accelerator(self, accelerator: Accelerator, provider: str) -> None:
        if not accelerator.name:
            self.errors.append(f"{provider}: accelerator {accelerator!r} has no name")
        elif accelerator.name in self.accelerators:
            self.errors.append(f"{provider}: accelerator {accelerator.name!r} is registered twice")
        else:
            self.accelerators[accelerator.name] = accelerator

    def add_kernel(self, spec: KernelSpec, provider: str) -> None:
        spec = KernelSpec(**{**spec.__dict__, "provider": provider})
        key = (spec.name, spec.device)
        old = self.kernels.get(key)
        if old is not None and old.impl != spec.impl:
            self.errors.append(f"kernel {spec.name!r} for {spec.device!r} is registered by both {old.provider} ({old.impl}) and {provider} ({spec.impl})")
            return
        # two packs of one distribution may register the same kernel: the first keeps it, both are its providers
        self.kernel_providers.setdefault(key, set()).add(provider)
        if old is None:
            self.kernels[key] = spec

    def add_backend(self, spec: BackendSpec, provider: str) -> None:
        spec = BackendSpec(**{**spec.__dict__, "provider": provider})
        old = self.backends.get(spec.name)
        if old is not None and old.factory != spec.factory:
            self.errors.append(f"backend {spec.name!r} is registered by both {old.provider} and {provider}")
            return
        self.backends[spec.name] = spec

    def add_reward(self, spec: RewardSpec, provider: str) -> None:
        spec = RewardSpec(**{**spec.__dict__, "provider": provider})
        if spec.takes not in REWARD_KINDS:
            self.errors.append(f"{provider}: reward {spec.name!r} takes={spec.takes!r}; a reward takes one of {', '.join(REWARD_KINDS)}")
            return
        old = self.rewards.get(spec.name)
        if old is not None and old.impl != spec.impl:
            self.errors.append(f"reward {spec.name!r} is registered by both {old.provider} ({old.impl}) and {provider} ({spec.impl})")
            return
        self.rewards[spec.name] = spec

    # -- lookup
    def accelerator(self, name: str = "auto") -> Accelerator:
        """The accelerator called ``name``, or for ``auto`` the best one available."""
        if name == "auto":
            available = [a for a in self.accelerators.values() if a.is_available()]
            if not available:
                raise MmcoreError("no accelerator is available (not even cpu): is mmcore installed whole?")
            return max(available, key=lambda a: a.priority)
        try:
            accelerator = self.accelerators[name]
        except KeyError:
            known = ", ".join(sorted(self.accelerators)) or "none"
            raise UsageError(f"unknown device {name!r}; known devices: {known}, auto") from None
        if not accelerator.is_available():
            raise UsageError(f"device {name!r} is not available on this machine", hint="run `mmcore doctor`")
        return accelerator

    def kernel_names(self) -> list[str]:
        return sorted({name for name, _ in self.kernels})

    def kernel_spec(self, name: str, device: str) -> KernelSpec:
        """The implementation of ``name`` chosen for ``device``: its own if usable, else the reference."""
        spec = self.kernels.get((name, device))
        if spec is not None and spec.usable():
            return spec
        try:
            return self.kernels[(name, REFERENCE)]
        except KeyError:
            raise UsageError(f"kernel {name!r} has no reference implementation registered") from None

    def kernel(self, name: str, device: str) -> Callable[..., Any]:
        return self.kernel_spec(name, device).load()

    def backend(self, name: str) -> BackendSpec:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends)) or "none installed"
            raise UsageError(f"unknown distributed backend {name!r}; known: {known}") from None

    def reward(self, name: str) -> RewardSpec:
        try:
            return self.rewards[name]
        except KeyError:
            known = ", ".join(sorted(self.rewards)) or "none installed"
            raise UsageError(f"training.grpo.rewards: unknown reward function {name!r}; known: {known} (a plugin adds more through mmcore_register_rewards)") from None
