"""The wan case of ``bench/peers.py``: the plain-diffusers peer, a Wan text-to-video fine-tuning
script as a user writes it from diffusers' parts (no mmcore import), and the held-out loss the
bench measures every side's saved transformer with.

diffusers ships no Wan training example; the Hugging Face trainer that has one, finetrainers
(0.1.0 / 0.2.0 on PyPI), does not run on a CPU: with no accelerator its device falls back to
"cuda" (``finetrainers.utils.torch.get_device_info``), and 0.2.0's wheel lacks the
``finetrainers.patches.dependencies`` package its ``__init__`` imports. So this script follows
diffusers' own examples (``train_text_to_image``'s loop, the flow-matching examples' noise
levels): every step, the batch's clips are read from their mp4 files (PyAV), encoded by the
frozen VAE (the posterior's mode, normalised by the config's ``latents_mean``/``latents_std`` as
``WanPipeline`` denormalises them) and their captions by the frozen UMT5 (``encode_prompt``);
levels drawn logit-normal (``compute_density_for_timestep_sampling``) then shifted by
``--shift``; ``x_s = (1 - s) x + s n``; the transformer's output regressed on ``n - x`` (MSE);
AdamW, constant lr, clip 1.0, fp32. The transformer is saved with ``save_pretrained``; step
times go to ``--steplog``.

    python bench/peers_diffusers.py --model DIR --data DIR --out DIR --steplog FILE [--steps 20 ...]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

#: the noise levels the held-out loss is measured at, one fixed noise draw a clip (mmcore's
#: diffusion kit holds out at the same levels)
EVAL_SIGMAS = (0.2, 0.4, 0.6, 0.8)


def read_clip(path: Path):  # type: ignore[no-untyped-def]
    """uint8 [F, H, W, 3] of every frame of an mp4 file."""
    import av
    import numpy as np

    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


class Encoder:
    """The checkpoint's frozen VAE and text encoder, used as ``WanPipeline`` uses them."""

    def __init__(self, model_dir: str | Path, max_sequence_length: int) -> None:
        import torch
        from diffusers import WanPipeline

        self.pipe = WanPipeline.from_pretrained(model_dir, transformer=None, torch_dtype=torch.float32)
        self.pipe.vae.requires_grad_(False).eval()
        self.pipe.text_encoder.requires_grad_(False).eval()
        config = self.pipe.vae.config
        self.mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
        self.max_sequence_length = max_sequence_length

    def __call__(self, root: Path, records: list[dict]) -> tuple:
        import numpy as np
        import torch

        with torch.no_grad():
            video = torch.from_numpy(np.stack([read_clip(root / r["path"]) for r in records])).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
            latents = (self.pipe.vae.encode(video).latent_dist.mode() - self.mean) / self.std
            text, _ = self.pipe.encode_prompt([r["cap"] for r in records], do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length, device=torch.device("cpu"))
        return latents, text


def velocity_error(transformer, latents, text, sigma, noise):  # type: ignore[no-untyped-def]
    """Mean squared error of the transformer's velocity at levels ``sigma`` [B]."""
    import torch

    s = sigma.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * latents + s * noise
    predicted = transformer(hidden_states=noisy, timestep=sigma * 1000, encoder_hidden_states=text, return_dict=False)[0]
    return torch.nn.functional.mse_loss(predicted.float(), (noise - latents).float())


def load_transformer(saved: str | Path):  # type: ignore[no-untyped-def]
    """A saved transformer folder, or the ``transformer/`` of a saved pipeline folder."""
    import torch
    from diffusers import WanTransformer3DModel

    saved = Path(saved)
    folder = saved / "transformer" if (saved / "transformer").is_dir() else saved
    return WanTransformer3DModel.from_pretrained(folder, torch_dtype=torch.float32)


def held_out_loss(model_dir: Path, saved: str, held_out: Path, batch: int, max_sequence_length: int) -> float:
    """Mean velocity error of ``saved`` on the clips of ``held_out`` at :data:`EVAL_SIGMAS`, one
    fixed noise draw each (the bench's one evaluation for every side)."""
    import torch

    encoder, transformer = Encoder(model_dir, max_sequence_length), load_transformer(saved).eval()
    records = json.loads(held_out.read_text())
    generator = torch.Generator().manual_seed(1234)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(records), batch):
            latents, text = encoder(held_out.parent, records[i : i + batch])
            for sigma in EVAL_SIGMAS:
                noise = torch.randn(latents.shape, generator=generator)
                total += float(velocity_error(transformer, latents, text, torch.full((len(latents),), sigma), noise)) * len(latents)
                count += len(latents)
    return total / count


def main() -> None:
    from peers_steplog import peer_arguments

    p = peer_arguments(__doc__, "folder with train.json, eval.json and the clips", cutoff=16)
    p.add_argument("--shift", type=float, default=3.0, help="the flow-matching shift of the noise levels")
    args = p.parse_args()

    import random

    import torch
    from diffusers.training_utils import compute_density_for_timestep_sampling

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    root = Path(args.data)
    records = json.loads((root / "train.json").read_text())
    encoder = Encoder(args.model, args.cutoff)
    transformer = load_transformer(args.model).train()
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=args.lr, weight_decay=0.0)
    order: list[int] = []
    with open(args.steplog, "a", encoding="utf-8") as log:
        for step in range(1, args.steps + 1):
            if len(order) < args.batch:  # epochs of a fresh shuffle each
                order += rng.sample(range(len(records)), len(records))
            batch, order = [records[i] for i in order[: args.batch]], order[args.batch :]
            latents, text = encoder(root, batch)
            u = compute_density_for_timestep_sampling("logit_normal", len(batch), logit_mean=0.0, logit_std=1.0)
            sigma = args.shift * u / (1 + (args.shift - 1) * u)
            loss = velocity_error(transformer, latents, text, sigma, torch.randn_like(latents))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            log.write(json.dumps({"step": step, "t": time.time(), "loss": float(loss)}) + "\n")
            log.flush()
    transformer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
