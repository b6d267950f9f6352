"""How the megatron backend asks for a family (mmcore.backends.megatron.family's protocols) instead of
fields in the generic contracts: a recipe is a MegatronRecipe by its method, a VLM-kit family a
MegatronPart / MegatronTable by its subclass's methods; SDK 1.x's keyword and fields still work,
with a deprecation warning. No megatron-core needed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mmcore.errors import StageError
from mmcore.kits.vlm import VLMFamily
from mmcore.kits.vlm.family import megatron_part_of, megatron_table_of
from mmcore.backends.megatron.family import MegatronPart, MegatronRecipe, MegatronTable
from mmcore.train import TrainRecipe

PARTS = {"build_model": lambda ctx, upstream: None, "dataset": lambda ctx, upstream: [], "collate": lambda samples: {}, "loss": lambda model, batch: 0}


def family(cls: type = VLMFamily, **fields: Any) -> Any:
    return cls(model_class="LlavaForConditionalGeneration", encoder=lambda ctx, model_dir, tokenizer: None, adapter=None, **fields)


def test_a_recipe_runs_on_megatron_by_its_method_and_a_plain_one_does_not() -> None:
    class Mine(TrainRecipe):
        def megatron_family(self, ctx: Any, upstream: Any) -> Any:
            return "the family"

    assert not isinstance(TrainRecipe(**PARTS), MegatronRecipe)
    assert not hasattr(TrainRecipe, "megatron")  # no longer one of the generic parts
    mine = Mine(**PARTS)
    assert isinstance(mine, MegatronRecipe) and mine.megatron_family(None, {}) == "the family"  # type: ignore[arg-type]


def test_the_sdk_1_keyword_still_makes_a_megatron_recipe_with_a_deprecation_warning() -> None:
    part = lambda ctx, upstream: "the family"  # noqa: E731
    with pytest.warns(DeprecationWarning, match=r"TrainRecipe\(megatron=\.\.\.\) is deprecated and goes in SDK 2.0"):
        old = TrainRecipe(**PARTS, megatron=part)
    assert isinstance(old, MegatronRecipe) and old.megatron_family is part
    assert not isinstance(TrainRecipe(**PARTS, megatron=None), MegatronRecipe)  # what the VLM kit passed without one


def test_the_backend_refuses_a_recipe_that_is_not_a_megatron_recipe_in_one_line() -> None:
    from mmcore.backends.megatron.backend import _family

    ctx = SimpleNamespace(pack="toy", config=SimpleNamespace(training=SimpleNamespace(method="dpo"), parallel=SimpleNamespace()))
    with pytest.raises(StageError, match=r"^parallel.backend: megatron: the toy pack does not run on megatron-core for training.method: dpo$"):
        _family(ctx, {}, TrainRecipe(**PARTS))  # type: ignore[arg-type]


def test_context_parallelism_is_refused_for_a_family_whose_model_does_not_split_its_sequences() -> None:
    """parallel.context_parallel needs the family's model to hand the decoder its rank's chunks
    (MegatronFamily.context_parallel); any other model would attend wrongly, so: one line."""
    from mmcore.backends.megatron.backend import _family
    from mmcore.backends.megatron.family import MegatronFamily

    made = MegatronFamily(build=lambda layout: None, parallel_map=None, adapter=None, inputs=("input_ids",))  # type: ignore[arg-type]

    class Mine(TrainRecipe):
        def megatron_family(self, ctx: Any, upstream: Any) -> Any:
            return made

    parallel = SimpleNamespace(tensor_parallel=1, pipeline_parallel=1, context_parallel=2, sequence_parallel=False, virtual_pipeline=1)
    training = SimpleNamespace(method="sft", optimizer="adamw", cpu_offload=False, max_tokens=None, packing=False, grad_accum_steps=1)
    ctx = SimpleNamespace(pack="toy", config=SimpleNamespace(training=training, parallel=parallel), world=SimpleNamespace(world_size=2))
    with pytest.raises(StageError, match=r"^parallel.context_parallel: the toy pack's model on megatron-core does not split its sequences \(MegatronFamily.context_parallel\)$"):
        _family(ctx, {}, Mine(**PARTS, weights=lambda ctx, upstream: None))  # type: ignore[arg-type]
    made.context_parallel = True
    assert _family(ctx, {}, Mine(**PARTS, weights=lambda ctx, upstream: None)) is made  # type: ignore[arg-type]


def test_a_vlm_family_declares_its_megatron_side_in_a_subclass() -> None:
    class WithMegatron(VLMFamily):
        def megatron_part(self, model_dir: Path) -> Any:
            return ("part", model_dir)

        def megatron_table(self, model_dir: Path) -> Any:
            return ("table", model_dir)

    plain, mine = family(), family(WithMegatron)
    assert not isinstance(plain, (MegatronPart, MegatronTable, MegatronRecipe))
    assert megatron_part_of(plain) is None and megatron_table_of(plain) is None
    assert isinstance(mine, MegatronPart) and isinstance(mine, MegatronTable) and not isinstance(mine, MegatronRecipe)
    assert megatron_part_of(mine)(Path("m")) == ("part", Path("m")) and megatron_table_of(mine)(Path("m")) == ("table", Path("m"))  # type: ignore[misc]


def test_the_sdk_1_fields_still_work_with_a_deprecation_warning() -> None:
    part, table = (lambda model_dir: "part"), (lambda model_dir: "table")
    with pytest.warns(DeprecationWarning) as warned:
        old = family(megatron=part, parallel_map=table)
    assert sorted(str(w.message).split(" is ")[0] for w in warned) == ["VLMFamily(megatron=...)", "VLMFamily(parallel_map=...)"]
    assert not isinstance(old, MegatronPart)  # the fields stand for the protocols: the kit reads either
    assert megatron_part_of(old) is part and megatron_table_of(old) is table


def test_old_import_paths_of_the_kit_still_import() -> None:
    import mmcore.kits.vlm as kit
    from mmcore.kits.vlm.dpo import VLMDPORecipe
    from mmcore.kits.vlm.recipe import VLMRecipe
    from mmcore.kits.vlm_dpo import PairSamples, answer_views, chosen_view, dpo_recipe  # noqa: F401
    from mmcore.sdk import LEGACY_SURFACE

    assert not [name for name in LEGACY_SURFACE["mmcore.kits.vlm"] if not hasattr(kit, name)]
    assert issubclass(VLMDPORecipe, VLMRecipe) and issubclass(VLMRecipe, TrainRecipe)
    assert VLMRecipe.loss.__module__ == "mmcore.kits.vlm.recipe"  # go to definition reaches the kit's loss, not a lambda
