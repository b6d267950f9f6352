"""The plain-transformers peer of ``bench/peers.py``: a Qwen2-VL SFT script as a user writes it
with ``transformers.Trainer`` (no mmcore import), on the bench's model folder and data files.

Samples are formatted as LLaMA-Factory's ``qwen2_vl`` template does (default system prompt; the
loss on the assistant's answer and its ``<|im_end|>\\n``), ``<image>`` expanded to the image's
merged patches; batches padded to their longest sample. At the end: one evaluation on the
held-out file, the model saved. Step times and tokens go to ``--steplog`` (peers_steplog.py).

    python bench/peers_trainer.py --model DIR --data DIR --out DIR --steplog FILE [--steps 20 ...]
"""

from __future__ import annotations

import json
from pathlib import Path

SYSTEM = "You are a helpful assistant."


class Encoding:
    """Token ids, labels and image patches of the bench's records, and their padded batches."""

    def __init__(self, model_dir: str | Path, cutoff: int, newline_label: bool = True) -> None:
        from transformers import AutoTokenizer

        try:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as ImageProcessor
        except ImportError:  # an older transformers: the one image processor it has
            from transformers import Qwen2VLImageProcessor as ImageProcessor

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.images = ImageProcessor.from_pretrained(model_dir)
        self.cutoff = cutoff
        self.newline_label = newline_label  # the "\n" after an answer's <|im_end|>: LLaMA-Factory trains on it

    def file(self, path: Path) -> list[dict]:
        return [self.encode(r, path.parent) for r in json.loads(path.read_text())]

    def encode(self, record: dict, root: Path) -> dict:
        from PIL import Image

        ids = self.tokenizer.convert_tokens_to_ids
        pics = [Image.open(root / path).convert("RGB") for path in record.get("images", [])]
        vision = self.images(images=pics, return_tensors="pt") if pics else None
        counts = iter([] if vision is None else (vision["image_grid_thw"].prod(-1) // self.images.merge_size**2).tolist())
        input_ids: list[int] = []
        labels: list[int] = []

        def add(text: str, train: bool) -> None:
            for i, part in enumerate(text.split("<image>")):
                if i:
                    media = [ids("<|vision_start|>")] + [ids("<|image_pad|>")] * next(counts) + [ids("<|vision_end|>")]
                    input_ids.extend(media)
                    labels.extend([-100] * len(media))
                piece = self.tokenizer(part, add_special_tokens=False)["input_ids"]
                input_ids.extend(piece)
                labels.extend(piece if train else [-100] * len(piece))

        add(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n", False)
        for turn in record["messages"]:
            if turn["role"] == "user":
                add(f"<|im_start|>user\n{turn['content']}<|im_end|>\n<|im_start|>assistant\n", False)
            else:
                add(f"{turn['content']}<|im_end|>", True)
                add("\n", self.newline_label)
        item = {"input_ids": input_ids[: self.cutoff], "labels": labels[: self.cutoff]}
        if vision is not None:
            item.update(pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"])
        return item

    def collate(self, items: list[dict]) -> dict:
        import torch

        longest = max(len(i["input_ids"]) for i in items)

        def padded(key: str, value: int) -> torch.Tensor:
            return torch.tensor([i[key] + [value] * (longest - len(i[key])) for i in items])

        batch = {"input_ids": padded("input_ids", self.tokenizer.pad_token_id), "labels": padded("labels", -100)}
        batch["attention_mask"] = torch.tensor([[1] * len(i["input_ids"]) + [0] * (longest - len(i["input_ids"])) for i in items])
        # which tokens are image patches (1; video would be 2): newer transformers' M-RoPE asks for it
        batch["mm_token_type_ids"] = (batch["input_ids"] == self.tokenizer.convert_tokens_to_ids("<|image_pad|>")).long()
        with_images = [i for i in items if "pixel_values" in i]
        if with_images:
            batch["pixel_values"] = torch.cat([i["pixel_values"] for i in with_images])
            batch["image_grid_thw"] = torch.cat([i["image_grid_thw"] for i in with_images])
        return batch


def held_out_loss(model_dir: Path, saved: str, held_out: Path, cutoff: int, batch: int) -> float:
    """Mean token loss of ``saved`` on ``held_out`` (the bench's one evaluation for every side;
    the shared tokenizer and image processor of ``model_dir``), over the tokens every side trains
    on: the answer and its ``<|im_end|>`` (LLaMA-Factory's template, and this script, also train
    on the ``\n`` after it; mmcore's chat-template encoder does not: a token one side never learns)."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    encoding = Encoding(model_dir, cutoff, newline_label=False)
    items = encoding.file(held_out)
    model = Qwen2VLForConditionalGeneration.from_pretrained(saved, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(items), batch):
            inputs = encoding.collate(items[i : i + batch])
            labels = inputs.pop("labels")[:, 1:]
            logits = model(**inputs).logits[:, :-1]
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"))
            count += int((labels != -100).sum())
    return total / count


def main() -> None:
    from peers_steplog import peer_arguments

    p = peer_arguments(__doc__, "folder with train.json, eval.json and the images")
    args = p.parse_args()

    import torch
    from transformers import Qwen2VLForConditionalGeneration, Trainer, TrainingArguments

    from peers_steplog import StepLog, trainer_options

    encoding = Encoding(args.model, args.cutoff)
    train, held_out = encoding.file(Path(args.data) / "train.json"), encoding.file(Path(args.data) / "eval.json")
    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32)
    training = TrainingArguments(
        **trainer_options(args),
        include_num_input_tokens_seen="non_padding",
    )
    trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=held_out, data_collator=encoding.collate, callbacks=[StepLog(args.steplog)])
    trainer.train()
    trainer.evaluate()
    trainer.save_model(args.out)


if __name__ == "__main__":
    main()
