"""Lumina-mGPT's main direction, text -> picture, on a tiny model: LLaMA-Factory-style samples
whose assistant turn is a picture train the picture's tokens in Lumina's layout (the loss falls
fast), and the evaluate stage has the export draw the held-out pictures greedily."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from mmcore.testing import stage_manifest as manifest
from mmcore.testing import train_losses

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def write_pictures(root: Path) -> Path:
    """Eight captioned pictures (a square or a circle of a colour on grey)."""
    from PIL import ImageDraw

    (root / "pics").mkdir(parents=True)
    records = []
    for colour, rgb in COLOURS.items():
        for shape in ("square", "circle"):
            picture = Image.new("RGB", (32, 32), (128, 128, 128))
            draw = ImageDraw.Draw(picture)
            (draw.rectangle if shape == "square" else draw.ellipse)((4, 4, 27, 27), fill=rgb)
            picture.save(root / f"pics/{colour}-{shape}.png")
            records.append({"messages": [{"role": "user", "content": f"a {colour} {shape}"}, {"role": "assistant", "content": "<image>"}], "images": [f"pics/{colour}-{shape}.png"]})
    (root / "pictures.json").write_text(json.dumps(records))
    return root / "pictures.json"


def test_pictures_train_and_the_export_draws_them_back(mm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = write_pictures(tmp_path / "data")
    common = ("--preset", "tiny", f"data.datasets=[{data}]", "training.micro_batch_size=8", "convert.verify=false")
    mm("run", "--pack", "lumina-mgpt", *common, "training.steps=30", "training.lr=0.01", "training.warmup_steps=0", f"evaluate.datasets=[{data}]", "evaluate.limit=8", "--run-dir", "r")
    losses = list(train_losses(tmp_path / "r").values())
    # per token: the picture's 16 codes, its size and new-line tokens, <eoss> and the separator over
    # the whole vocabulary (~490 ids at the start)
    assert losses[0] > 4.0 and sum(losses[-5:]) / 5 < 0.5 * losses[0], losses
    evaluate = manifest(tmp_path / "r", "evaluate")["metrics"]
    # the eight training pictures, drawn from their captions: the trained model reproduces most codes
    assert evaluate["pictures"] == 8 and evaluate["image_token_accuracy"] >= 0.5, evaluate
    rows = [json.loads(line) for line in (tmp_path / "r/evaluate/pictures.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(len(r["tokens"]) == 4 * 5 + 2 for r in rows)
