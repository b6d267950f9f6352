"""``mmcore new-pack``: a complete, installable pack distribution on the kits, ready to fill in.

Generated for a transformers conversational class (``--from-transformers``; LLaVA-1.5's class by
default), the pack runs every stage before its author changes a line: the tiny preset on a
random-weight checkpoint built from the class's own config, the demo preset learning the
coloured-shapes task. What the author then edits is one file, ``family.py``.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import click

from mmcore import __version__
from mmcore.errors import UsageError
from mmcore.sdk import SDK_VERSION

KITS = {"vlm": "vlm", "omni": "vlm"}  # category -> the kit its skeleton is built on
DEFAULT_CLASS = "LlavaForConditionalGeneration"


def module_name(name: str) -> str:
    module = "mm_pack_" + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if not module.isidentifier() or keyword.iskeyword(module):
        raise UsageError(f"pack name {name!r} does not make a Python module name")
    return module


def files(name: str, category: str, model_class: str, pipeline: str | None = None) -> dict[str, str]:
    """Relative path -> text of every file of the new distribution (on the diffusion kit for a
    diffusers ``pipeline`` class)."""
    module = module_name(name)
    major, minor = (int(p) for p in __version__.split(".")[:2])
    values = {
        "name": name,
        "module": module,
        "category": category,
        "cls": model_class,
        "sdk": SDK_VERSION,
        "var": module.removeprefix("mm_pack_"),
        "mmcore_pin": f"mmcore>={major}.{minor},<{major}.{minor + 1}",
    }
    if pipeline is not None:
        from mmcore.cli.newpack_diffusers import diffusers_files

        return diffusers_files(name, pipeline, values)
    return {path.format(**values): text.replace("{{", "\x00").replace("}}", "\x01").format(**values).replace("\x00", "{").replace("\x01", "}") for path, text in TEMPLATES.items()}


def write_pack(name: str, category: str, directory: Path, model_class: str, pipeline: str | None = None) -> Path:
    if pipeline is None and category not in KITS:
        raise UsageError(f"--category {category}: no kit yet for {category} packs (kits: {', '.join(sorted(KITS))}); see docs/writing-a-pack.md for a pack written on the stage engines directly")
    root = directory / f"mm-pack-{name}"
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"{root} exists and is not empty; choose another --dir or name")
    made = files(name, category, model_class, pipeline)
    for rel, text in made.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def installed_pack(name: str) -> str | None:
    """The installed distribution that provides pack ``name`` (entry points only: no pack is imported)."""
    from importlib import metadata

    from mmcore.framework.plugins import PACK_GROUP

    for entry in metadata.entry_points(group=PACK_GROUP):
        if entry.name == name:
            return entry.dist.name if entry.dist is not None else entry.value
    return None


@click.command("new-pack")
@click.argument("name")
@click.option("--category", type=click.Choice(["vlm", "generative", "audio", "omni"]), required=True, help="What kind of model.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True, help="Where to create mm-pack-NAME/.")
@click.option("--from-transformers", "from_transformers", metavar="CLASS", help=f"A transformers conversational class (default {DEFAULT_CLASS}).")
@click.option(
    "--from-diffusers",
    "from_diffusers",
    metavar="PIPELINE",
    help="A diffusers pipeline class (WanPipeline, FluxPipeline, CogVideoXPipeline, LTXPipeline, ...): a generative pack on the diffusion kit.",
)
def new_pack_cmd(name: str, category: str, directory: Path, from_transformers: str | None, from_diffusers: str | None) -> None:
    """Create a pack distribution NAME on mmcore's kits: pyproject, package, presets, tests, README."""
    from mmcore.framework.pack import _PACK_NAME

    if not _PACK_NAME.match(name):
        raise UsageError(f"pack name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    taken = installed_pack(name)
    if taken:  # two packs of one name: the second would be reported broken and never load
        raise UsageError(f"pack name {name!r} is taken: {taken} is installed and provides it (see `mmcore list`); choose another name")
    if from_diffusers or category == "generative":
        if category != "generative" or from_transformers:
            raise UsageError("--from-diffusers goes with --category generative (and not --from-transformers)")
        if not from_diffusers:
            raise UsageError("--category generative: name the diffusers pipeline class with --from-diffusers (e.g. WanPipeline, FluxPipeline, CogVideoXPipeline, LTXPipeline)")
        try:
            import diffusers  # noqa: F401
        except ImportError:
            raise UsageError("new-pack --from-diffusers needs diffusers installed: pip install 'diffusers>=0.35,<1'") from None
        root = write_pack(name, category, directory, from_diffusers, pipeline=from_diffusers)
        click.echo(f"created {root}")
        click.echo(f"  pip install -e {root}          # then: mmcore list")
        click.echo(f"  mmcore run --pack {name} --preset tiny")
        click.echo(f"  pytest {root}/tests            # the conformance suite runs every stage")
        click.echo(f"  edit {root}/src/{module_name(name)}/family.py for what is your family's own")
        return
    model_class = from_transformers or DEFAULT_CLASS
    try:
        import transformers
    except ImportError:
        raise UsageError("new-pack --from-transformers needs transformers installed") from None
    if not hasattr(transformers, model_class):
        raise UsageError(f"--from-transformers {model_class}: transformers {transformers.__version__} has no such class")
    root = write_pack(name, category, directory, model_class)
    click.echo(f"created {root}")
    click.echo(f"  pip install -e {root}          # then: mmcore list")
    click.echo(f"  mmcore run --pack {name} --preset tiny")
    click.echo(f"  pytest {root}/tests            # the conformance suite runs every stage")
    click.echo(f"  edit {root}/src/{module_name(name)}/family.py for what is your family's own")


def pyproject_template(description: str, dependencies: list[str]) -> str:
    """A generated pack's ``pyproject.toml``, as a template of the others' kind (``{name}``,
    ``{module}``, ``{var}``, ``{mmcore_pin}`` filled with ``str.format``; the description may
    hold such fields too): one place for the build, entry point and test settings of both
    ``new-pack`` kinds."""
    requirements = "".join(f'    "{requirement}",\n' for requirement in ["{mmcore_pin}", *dependencies])
    return f"""[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "mm-pack-{{name}}"
version = "0.1.0"
description = "{description}"
requires-python = ">=3.10"
dependencies = [
{requirements}]

[project.entry-points."mmcore.packs"]
"{{name}}" = "{{module}}.pack:{{var}}"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
{{module}} = ["presets/*.yaml"]

[tool.pytest.ini_options]
testpaths = ["tests"]
# checkpoints saved and loaded in one process without a process group is what mmcore means
filterwarnings = ["ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"]
"""


TEMPLATES: dict[str, str] = {
    "pyproject.toml": pyproject_template(
        "mmcore pack for {cls}: download, convert, preprocess, train, export, evaluate, infer.",
        ["transformers>=5.0,<6", "tokenizers>=0.20", "safetensors>=0.4", "pillow>=10"],
    ),
    "src/{module}/__init__.py": '''"""mmcore pack for {cls}."""
''',
    "src/{module}/pack.py": '''"""The {name} pack, declared: what it is, its presets, and the function behind each stage.

Importing this module must stay light (no torch, no transformers): ``mmcore list`` imports it.
"""

from mmcore import PackSpec, Stage

{var} = PackSpec(
    name="{name}",
    category="{category}",
    summary="{cls} conversational models",
    sdk="{sdk}",
    config_class="{module}.config:Config",
    presets={{"demo": "presets/demo.yaml", "tiny": "presets/tiny.yaml"}},
    default_preset="demo",
    distributed_stages=("train",),
    stages={{
        "download": Stage("mmcore.engines:download_stage", parts={{"build_init": "{module}.family:build_init_checkpoint"}}),
        "convert": Stage("mmcore.engines:convert_stage", parts={{"adapter": "{module}.family:FAMILY.adapter",
                                                               "build_model": "{module}.family:FAMILY.build_model"}}),
        "preprocess": "{module}.family:FAMILY.preprocess",
        "train": Stage("mmcore.train:train_stage", parts={{"recipe": "{module}.family:FAMILY.recipe"}}),
        "export": "{module}.family:FAMILY.export",
        "evaluate": "{module}.family:FAMILY.evaluate",
        "infer": "{module}.family:FAMILY.infer",
    }},
)
''',
    "src/{module}/family.py": '''"""{cls} as mmcore's VLM kit sees it: everything the pack's stages need to know.

Generated by ``mmcore new-pack``: it runs as it is, on what transformers knows of the class
(its processor expands images, its conversion mapping names the checkpoint's tensors, the
tokenizer's chat template formats and masks turns). Replace a piece where your family differs:
``auto_family(..., shard_layers=..., freeze_groups=..., collate_extra=..., packed_positions=...)``
(every field: ``mmcore.kits.vlm.VLMFamily``), your own ``adapter`` for checkpoints that need
more than renaming, your own encoder for video or audio.
"""

from __future__ import annotations

from pathlib import Path

from mmcore.data import write_shape_questions
from mmcore.engines import pick_preset
from mmcore.kits import TINY_SIZES, auto_family, tiny_checkpoint

MODEL_CLASS = "{cls}"

FAMILY = auto_family(MODEL_CLASS, demo=write_shape_questions)

# Words the tiny tokenizer learns whole: the demo's questions and answers, plus letters.
CORPUS = [
    "What colour is the triangle? What colour is the square? What colour is the circle?",
    "red green blue yellow USER: ASSISTANT: system user assistant",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\\"()-",
]

PRESETS = {{
    "tiny": dict(TINY_SIZES),
    "demo": {{**TINY_SIZES, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16}},
}}


def build_init_checkpoint(preset: str, out: Path, seed: int) -> None:
    """``model.source: init:<preset>``: a random-weight checkpoint built offline."""
    tiny_checkpoint(MODEL_CLASS, out, seed, corpus=CORPUS, sizes=pick_preset(PRESETS, preset))
''',
    "src/{module}/config.py": '''"""The {name} pack's config: mmcore's sections, with MLLM JSON data."""

from pydantic import Field

from mmcore.config import RunConfig
from mmcore.data import MLLMDataSection


class Data(MLLMDataSection):
    """MLLM JSON options (conversations with ``<image>`` placeholders); add your family's own here."""


class Config(RunConfig):
    data: Data = Field(default_factory=Data)
''',
    "src/{module}/presets/tiny.yaml": """# The smallest {cls} that runs every stage: for tests and trying things out.
model:
  source: init:tiny
data:
  demo_samples: 16
  cutoff_len: 1024   # room for families whose processor tiles an image into many tokens
training:
  steps: 4
  lr: 0.001
  micro_batch_size: 2
""",
    "src/{module}/presets/demo.yaml": """# A small {cls} learns to name the colour of a shape, on CPU in a few minutes.
model:
  source: init:demo
data:
  demo_samples: 320
  cutoff_len: 1024
training:
  steps: 200
  lr: 0.0015   # 5 seeds x native and AVX2 math x 1 and 2 threads: >= 95% from step 40 on (tools/demo_matrix.py)
  warmup_steps: 10
  micro_batch_size: 16
  eval_every: 50
  checkpoint_every: 50
""",
    "tests/test_{var}_conformance.py": '''"""mmcore's conformance suite: every stage of the pack run for real on the tiny preset,
the stage contract, a kill -9 and resume, the export reloaded."""

from mmcore.testing import PackConformance


class TestConformance(PackConformance):
    pack_name = "{name}"
''',
    "tests/test_{var}_data.py": '''"""The pack's preprocessing: the chat template's format, its answers learnt, images expanded
to as many tokens as the model makes features."""

from pathlib import Path

from mmcore.data import IGNORE, Sample, Turn
from mmcore.testing.media import write_image


def test_a_conversation_encodes_and_runs_through_the_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from types import SimpleNamespace

    from {module}.config import Config
    from {module}.family import FAMILY, build_init_checkpoint

    build_init_checkpoint("tiny", tmp_path / "model", seed=0)
    write_image(tmp_path / "a.png", (220, 30, 30), (56, 56))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    encoder = FAMILY.encoder(SimpleNamespace(config=Config()), tmp_path / "model", tokenizer)
    sample = Sample("x.json", 0, [Turn("user", "<image>What colour is the square?"), Turn("assistant", "red")], {{"images": [tmp_path / "a.png"]}})
    encoded = encoder.encode(sample)
    learnt = tokenizer.decode([t for t, label in zip(encoded.input_ids, encoded.labels) if label != IGNORE])
    assert learnt.strip().startswith("red")
    batch = FAMILY.collate([{{"input_ids": torch.tensor(encoded.input_ids), "labels": torch.tensor(encoded.labels), **encoded.tensors}}],
                           FAMILY.token_ids_of(tokenizer))
    with torch.no_grad():
        loss = FAMILY.loss_sum(FAMILY.build_model(tmp_path / "model").eval(), batch)
    assert torch.isfinite(loss)
''',
    "README.md": """# mm-pack-{name}

An mmcore pack for `{cls}`, generated by `mmcore new-pack`.

```
pip install -e .
mmcore list                                   # {name} is there
mmcore run --pack {name} --preset tiny        # every stage on a random-weight tiny model
mmcore run --pack {name} --preset demo        # a small model learns the coloured-shapes task
pytest tests                                  # the conformance suite runs every stage
```

Train on your own data: `mmcore run --pack {name} model.source=ORG/REPO --data conversations.json`
(MLLM JSON: `messages` with `<image>` placeholders and an `images` list).

What is this family's own lives in `src/{module}/family.py`; the stages come from mmcore's VLM
kit. See mmcore's `docs/writing-a-pack.md`.
""",
}
