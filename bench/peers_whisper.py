"""The whisper case of ``bench/peers.py``: the plain-transformers peer, a Whisper fine-tuning
script as a user writes it with ``Seq2SeqTrainer`` (no mmcore import), and the encoding the
bench's held-out evaluation shares with it.

Audio: 16-bit wav read with the standard library, log-mel features from the checkpoint's
``WhisperFeatureExtractor``; labels ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>
text<|endoftext|>`` from its ``WhisperTokenizer`` (the start token stripped in the collator, as
the model prepends it: the loss covers the rest, as mmcore's whisper pack). At the end: one
evaluation on the held-out file, the model saved; step times to ``--steplog``.

    python bench/peers_whisper.py --model DIR --data DIR --out DIR --steplog FILE [--steps 20 ...]
"""

from __future__ import annotations

import json
import wave
from pathlib import Path


class Encoding:
    """Log-mel features and labels of transcript records (``{"audio", "text", "language"}``)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import WhisperFeatureExtractor, WhisperTokenizer

        self.features = WhisperFeatureExtractor.from_pretrained(model_dir)
        self.tokenizer = WhisperTokenizer.from_pretrained(model_dir, language="en", task="transcribe", predict_timestamps=False)
        self.start = self.tokenizer.convert_tokens_to_ids("<|startoftranscript|>")

    def file(self, path: Path) -> list[dict]:
        return [self.encode(json.loads(line), path.parent) for line in path.read_text().splitlines() if line.strip()]

    def encode(self, record: dict, root: Path) -> dict:
        import numpy as np

        with wave.open(str(root / record["audio"]), "rb") as clip:
            pcm = np.frombuffer(clip.readframes(clip.getnframes()), dtype="<i2").astype(np.float32) / 32768
            rate = clip.getframerate()
        features = self.features(pcm, sampling_rate=rate, return_tensors="pt")["input_features"][0]
        return {"input_features": features, "labels": self.tokenizer(record["text"])["input_ids"]}

    def collate(self, items: list[dict]) -> dict:
        import torch

        labels = [i["labels"][1:] if i["labels"][0] == self.start else i["labels"] for i in items]
        longest = max(len(lab) for lab in labels)
        return {
            "input_features": torch.stack([i["input_features"] for i in items]),
            "labels": torch.tensor([lab + [-100] * (longest - len(lab)) for lab in labels]),
        }


def held_out_loss(model_dir: Path, saved: str, held_out: Path, batch: int) -> float:
    """Mean token loss of ``saved`` on ``held_out`` (the bench's one evaluation for every side)."""
    import torch
    from transformers import WhisperForConditionalGeneration

    encoding = Encoding(model_dir)
    items = encoding.file(held_out)
    model = WhisperForConditionalGeneration.from_pretrained(saved, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(items), batch):
            inputs = encoding.collate(items[i : i + batch])
            logits = model(**inputs).logits
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), inputs["labels"].flatten(), ignore_index=-100, reduction="sum"))
            count += int((inputs["labels"] != -100).sum())
    return total / count


def main() -> None:
    from peers_steplog import peer_arguments

    p = peer_arguments(__doc__, "folder with train.jsonl, eval.jsonl and the clips", cutoff=0)
    args = p.parse_args()

    import torch
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, WhisperForConditionalGeneration

    from peers_steplog import StepLog, trainer_options

    encoding = Encoding(args.model)
    train, held_out = encoding.file(Path(args.data) / "train.jsonl"), encoding.file(Path(args.data) / "eval.jsonl")
    model = WhisperForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32)
    training = Seq2SeqTrainingArguments(
        **trainer_options(args),
        predict_with_generate=False,
    )
    trainer = Seq2SeqTrainer(model=model, args=training, train_dataset=train, eval_dataset=held_out, data_collator=encoding.collate, callbacks=[StepLog(args.steplog)])
    trainer.train()
    trainer.evaluate()
    trainer.save_model(args.out)


if __name__ == "__main__":
    main()
