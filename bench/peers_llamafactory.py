"""The LLaMA-Factory peer of ``bench/peers.py``, run by the python of LLaMA-Factory's own
environment: its ``run_exp`` (what ``llamafactory-cli train config.yaml`` calls) on the bench's
model folder and ``dataset_info.json``, full fine-tuning of every parameter, plus a step log
(peers_steplog.py).

Two shims, both because no torchvision or torchaudio build loads beside this CPU-only torch:
``import torchaudio`` (at the top of LLaMA-Factory's mm_plugin, used for audio only) finds an
empty module, and the Qwen2-VL processor is built without its video processor (transformers'
needs torchvision), its image processor standing in where LLaMA-Factory checks for one. Images go through the same image
processor either way; the data here has no audio or video.

    python bench/peers_llamafactory.py --model DIR --data DIR --out DIR --steplog FILE [--steps 20 ...]
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def no_torchaudio() -> None:
    module = types.ModuleType("torchaudio")
    module.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)

    def missing(name: str):  # type: ignore[no-untyped-def]
        raise AttributeError(f"torchaudio.{name}: no torchaudio here (bench/peers_llamafactory.py)")

    module.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules["torchaudio"] = module


def processor_without_video() -> None:
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2VLProcessorWithoutVideo(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):  # type: ignore[no-untyped-def]
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            # transformers reads the parts from this signature
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
            if getattr(self, "video_processor", None) is None:  # LLaMA-Factory asks for one; never used here (no videos)
                self.video_processor = image_processor

    import llamafactory.model.loader as loader

    class AutoProcessor:
        @staticmethod
        def from_pretrained(path, **kwargs):  # type: ignore[no-untyped-def]
            return Qwen2VLProcessorWithoutVideo.from_pretrained(path, **kwargs)

    loader.AutoProcessor = AutoProcessor


def main() -> None:
    from peers_steplog import peer_arguments

    p = peer_arguments(__doc__, "folder with dataset_info.json (peers_train, peers_eval)")
    p.add_argument("--image-max-pixels", type=int, default=112 * 112)
    args = p.parse_args()
    no_torchaudio()
    processor_without_video()
    from llamafactory.train.tuner import run_exp

    from peers_steplog import StepLog

    config = {
        "model_name_or_path": args.model,
        "image_max_pixels": args.image_max_pixels,
        "stage": "sft",
        "do_train": True,
        "do_eval": True,
        "finetuning_type": "full",
        "freeze_vision_tower": False,
        "freeze_multi_modal_projector": False,
        "dataset": "peers_train",
        "eval_dataset": "peers_eval",
        "dataset_dir": args.data,
        "template": "qwen2_vl",
        "cutoff_len": args.cutoff,
        "overwrite_cache": True,
        "output_dir": args.out,
        "overwrite_output_dir": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "plot_loss": False,
        "per_device_train_batch_size": args.batch,
        "per_device_eval_batch_size": args.batch,
        "gradient_accumulation_steps": 1,
        "learning_rate": args.lr,
        "max_steps": args.steps,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "seed": args.seed,
        "dataloader_num_workers": 0,
        "include_num_input_tokens_seen": "non_padding",
    }
    run_exp(config, callbacks=[StepLog(args.steplog)])


if __name__ == "__main__":
    main()
