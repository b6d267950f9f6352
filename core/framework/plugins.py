"""Loading packs and plugins from entry points into one pluggy manager.

* Group ``mmcore.plugins``: infrastructure (accelerators, backends, metric sinks, commands).
* Group ``mmcore.packs``: model families; the entry-point name is the pack name.

Each entry point loads in its own try/except: a broken one is recorded with its error and
never stops the others. Two distributions providing the same name are both refused, naming
both (pluggy alone would keep one silently). Environment variables:

* ``MMCORE_DISABLE_PLUGINS=name,name`` skips those entry points (``*`` skips all but builtins
  that the CLI cannot work without: none are required, so ``*`` skips everything).
* ``MMCORE_TRACE_HOOKS=1`` prints every hook call to stderr.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

import pluggy

from mmcore.framework import hookspecs
from mmcore.errors import PackError
from mmcore.framework.pack import STAGES, PackSpec
from mmcore.framework.registry import BackendSpec, KernelSpec, Registry
from mmcore.sdk import sdk_problem
from mmcore.framework.stages import declared_stages

PACK_GROUP = "mmcore.packs"
PLUGIN_GROUP = "mmcore.plugins"
HOOK_PREFIX = "mmcore_"


@dataclass
class Entry:
    """One entry point (a pack or a plugin) and what became of it."""

    kind: str  # "pack" or "plugin"
    name: str
    value: str
    distribution: str | None = None
    version: str | None = None
    plugin: Any = None
    spec: PackSpec | None = None
    error: str | None = None
    location: str = "host"
    stages_plugin: Any = None  # the plugin made from PackSpec.stages (mmcore.framework.stages)

    @property
    def ok(self) -> bool:
        return self.error is None and self.plugin is not None

    @property
    def pm_name(self) -> str:
        return f"{self.kind}:{self.name}"

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.value,
            "location": self.location,
            "ok": self.ok,
            "error": self.error,
        }
        if self.kind == "pack" and self.spec is not None:
            data["category"] = self.spec.category
            data["summary"] = self.spec.summary
            data["presets"] = sorted(self.spec.presets)
        return data


@dataclass(frozen=True, eq=False)  # hashed by identity, as pluggy keeps plugins in sets
class DeclaredPack:
    """The plugin object of a pack whose entry point is a bare :class:`PackSpec`."""

    PACK: PackSpec


class MmcorePluginManager(pluggy.PluginManager):
    """A pluggy manager that treats every ``mmcore_*`` function as a hook implementation.

    pluggy alone ignores unmarked functions, so a pack defining ``mmcore_trian`` would be
    silently ignored; this way the typo reaches :meth:`check_pending` and is reported.
    """

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(HOOK_PREFIX):
            attr = inspect.getattr_static(plugin, name, None)
            if inspect.isfunction(attr) or isinstance(attr, (staticmethod, classmethod)):
                return {}
        return opts


def new_plugin_manager() -> MmcorePluginManager:
    pm = MmcorePluginManager("mmcore")
    pm.add_hookspecs(hookspecs)
    return pm


def _disabled_names() -> set[str]:
    raw = os.environ.get("MMCORE_DISABLE_PLUGINS", "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def _unknown_hooks(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    problems = []
    spec_names = [name for name in vars(pm.hook) if name.startswith(HOOK_PREFIX) and getattr(pm.hook, name).has_spec()]
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec():
            continue
        if all(impl.optionalhook for impl in caller.get_hookimpls() if impl.plugin is plugin):
            continue
        guess = difflib.get_close_matches(caller.name, spec_names, n=1)
        problems.append(f"unknown hook {caller.name!r}" + (f" (did you mean {guess[0]!r}?)" if guess else ""))
    return problems


@dataclass
class Plugins:
    """The loaded world: the plugin manager, every pack and plugin entry, and the registries."""

    pm: MmcorePluginManager
    packs: dict[str, Entry] = field(default_factory=dict)
    plugins: dict[str, Entry] = field(default_factory=dict)
    _registry: Registry | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, *, extra_packs: Iterable[tuple[str, Any]] = (), installed_packs: bool = True) -> "Plugins":
        """Load every entry point of both groups, plus ``extra_packs`` (name, object) pairs.

        ``installed_packs=False`` leaves out the installed packs (tests use it to get the
        infrastructure plugins and exactly the packs they pass in ``extra_packs``).
        """
        world = cls(new_plugin_manager())
        if os.environ.get("MMCORE_TRACE_HOOKS"):
            world.pm.trace.root.setwriter(sys.stderr.write)
            world.pm.enable_tracing()
        disabled = _disabled_names()
        world._load_group("plugin", PLUGIN_GROUP, disabled)
        if installed_packs:
            world._load_group("pack", PACK_GROUP, disabled)
        for name, obj in extra_packs:
            entry = Entry("pack", name, value=repr(obj), distribution="(in-process)")
            world._register(entry, obj)
            world.packs[name] = entry
        # pluggy's own guard; every entry with an unknown hook was already refused above.
        world.pm.check_pending()
        return world

    def _load_group(self, kind: str, group: str, disabled: set[str]) -> None:
        table = self.packs if kind == "pack" else self.plugins
        by_name: dict[str, list[md.EntryPoint]] = {}
        for ep in md.entry_points(group=group):
            by_name.setdefault(ep.name, []).append(ep)
        for name, eps in sorted(by_name.items()):
            if name in disabled or "*" in disabled:
                continue
            entries = [self._entry(kind, ep) for ep in eps]
            if len(entries) > 1:
                owners = " and ".join(f"{e.distribution} {e.version}" for e in entries)
                entry = entries[0]
                entry.error = f"{kind} {name!r} is provided by both {owners}; uninstall one of them"
                entry.distribution = ", ".join(str(e.distribution) for e in entries)
                table[name] = entry
                continue
            entry, ep = entries[0], eps[0]
            try:
                obj = ep.load()
            except BaseException as exc:  # a pack may raise anything at import, even SystemExit
                if isinstance(exc, KeyboardInterrupt):
                    raise
                entry.error = f"import failed: {type(exc).__name__}: {exc}"
                table[name] = entry
                continue
            self._register(entry, obj)
            table[name] = entry

    @staticmethod
    def _entry(kind: str, ep: md.EntryPoint) -> Entry:
        dist = getattr(ep, "dist", None)
        return Entry(
            kind,
            ep.name,
            ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
        )

    def _register(self, entry: Entry, obj: Any) -> None:
        try:
            if inspect.isclass(obj):
                obj = obj()
            if entry.kind == "pack" and isinstance(obj, PackSpec):
                obj = DeclaredPack(obj)  # a pack that is all declaration: no hooks of its own
            if entry.kind == "pack":
                spec = getattr(obj, "PACK", None)
                if not isinstance(spec, PackSpec):
                    raise PackError("has no PACK attribute of type mmcore.PackSpec")
                if spec.name != entry.name:
                    raise PackError(f"PACK.name is {spec.name!r} but the entry point is named {entry.name!r}")
                entry.spec = spec
                why = sdk_problem(spec.sdk)
                if why:
                    raise PackError(why)
                both = [s for s in spec.stages if inspect.getattr_static(obj, hookspecs.STAGE_HOOKS[s], None) is not None]
                if both:
                    raise PackError(f"stage {both[0]!r} is both declared in PACK.stages and implemented as {hookspecs.STAGE_HOOKS[both[0]]}")
            self.pm.register(obj, name=entry.pm_name)
        except Exception as exc:
            entry.error = (str(exc) if isinstance(exc, PackError) else f"{type(exc).__name__}: {exc}").replace("\n", " ")
            return
        problems = _unknown_hooks(self.pm, obj)
        if problems:
            self.pm.unregister(obj)
            entry.error = "; ".join(problems)
            return
        if entry.spec is not None and entry.spec.stages:
            entry.stages_plugin = declared_stages(entry.spec)
            self.pm.register(entry.stages_plugin, name=f"{entry.pm_name}#stages")
        entry.plugin = obj

    # ------------------------------------------------------------------ queries
    def pack(self, name: str) -> Entry:
        """The loaded pack ``name``, or a one-line :class:`PackError` saying why not."""
        entry = self.packs.get(name)
        if entry is None:
            known = ", ".join(sorted(n for n, e in self.packs.items() if e.ok)) or "none installed"
            guess = difflib.get_close_matches(name, list(self.packs), n=1)
            hint = f"did you mean {guess[0]!r}?" if guess else "install one, e.g. `pip install mm-pack-<family>`"
            raise PackError(f"unknown pack {name!r}; installed packs: {known}", hint=hint)
        if not entry.ok:
            raise PackError(f"pack {name!r} ({entry.distribution}) is broken: {entry.error}")
        return entry

    def implemented_stages(self, name: str) -> list[str]:
        """The stages pack ``name`` runs, declared or implemented as hooks, in pipeline order."""
        entry = self.pack(name)
        callers = {c.name for p in (entry.plugin, entry.stages_plugin) if p is not None for c in self.pm.get_hookcallers(p) or []}
        return [stage for stage in STAGES if hookspecs.STAGE_HOOKS[stage] in callers]

    def has_infer(self, name: str) -> bool:
        """Whether pack ``name`` answers ``mmcore infer`` (declared or as a hook)."""
        entry = self.pack(name)
        return any(c.name == "mmcore_infer" for p in (entry.plugin, entry.stages_plugin) if p is not None for c in self.pm.get_hookcallers(p) or [])

    def stage_caller(self, name: str, stage: str) -> pluggy.HookCaller:
        """The stage hook of pack ``name`` alone (plus infrastructure wrappers)."""
        others = [p for n, e in self.packs.items() if n != name and e.ok for p in (e.plugin, e.stages_plugin) if p is not None]
        return self.pm.subset_hook_caller(hookspecs.STAGE_HOOKS[stage], remove_plugins=others)

    @property
    def registry(self) -> Registry:
        """Accelerators, kernels and backends from every loaded plugin, built on first use."""
        if self._registry is None:
            self._registry = self._build_registry()
        return self._registry

    def _build_registry(self) -> Registry:
        registry = Registry()
        adders = {
            "mmcore_register_accelerators": registry.add_accelerator,
            "mmcore_register_kernels": registry.add_kernel,
            "mmcore_register_backends": registry.add_backend,
            "mmcore_register_rewards": registry.add_reward,
        }
        for hook_name, add in adders.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                provider = impl.plugin_name

                def register(item: Any, _add=add, _provider=provider) -> None:
                    _add(item, _provider)

                try:
                    impl.function(register=register)
                except Exception as exc:
                    registry.errors.append(f"{provider}: {hook_name} failed: {type(exc).__name__}: {exc}")
        return registry

    def commands(self) -> list[tuple[str, Any]]:
        """CLI commands from ``mmcore_register_commands``: (provider, click command)."""
        found: list[tuple[str, Any]] = []
        for impl in self.pm.hook.mmcore_register_commands.get_hookimpls():
            try:
                impl.function(register=lambda cmd, _p=impl.plugin_name: found.append((_p, cmd)))
            except Exception as exc:
                print(f"warning: {impl.plugin_name}: mmcore_register_commands failed: {exc}", file=sys.stderr)
        return found

    def problems(self) -> list[str]:
        lines = [f"{e.kind} {e.name!r} ({e.distribution}): {e.error}" for e in [*self.plugins.values(), *self.packs.values()] if e.error]
        return lines


__all__ = ["Entry", "Plugins", "PACK_GROUP", "PLUGIN_GROUP", "KernelSpec", "BackendSpec", "new_plugin_manager"]
