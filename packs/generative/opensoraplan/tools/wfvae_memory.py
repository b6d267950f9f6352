"""Peak memory of one WF-VAE encode or decode of the released model's size (random weights,
float32, CPU), whole or in chunks, as the pack README reports it; by hand, one process per run
(``ru_maxrss`` is a process's peak)::

    OMP_NUM_THREADS=1 python packs/generative/opensoraplan/tools/wfvae_memory.py encode whole 97 256
    OMP_NUM_THREADS=1 python packs/generative/opensoraplan/tools/wfvae_memory.py encode 8 97 256
    OMP_NUM_THREADS=1 python packs/generative/opensoraplan/tools/wfvae_memory.py decode 2 9 32

``encode CHUNK FRAMES SIZE``: a clip of FRAMES frames of SIZE x SIZE, CHUNK frames a pass (or
``whole``); ``decode CHUNK LATENT_FRAMES LATENT_SIZE``: latents of that size, CHUNK latent frames a
pass. Prints the output's shape, the seconds, and the peak RSS beside that of the model and input
(GB here: 10^6 KiB, as ``ru_maxrss`` counts).
"""

import resource
import sys
import time

import torch

from mm_pack_opensoraplan.wfvae import WFVAEModel

RELEASED = {
    "latent_dim": 32,
    "base_channels": 160,
    "encoder_energy_flow_hidden_size": 128,
    "decoder_energy_flow_hidden_size": 128,
    "norm_type": "layernorm",
    "t_interpolation": "trilinear",
    "connect_res_layer_num": 1,
}

if __name__ == "__main__":
    what, chunk, frames, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.manual_seed(0)
    vae = WFVAEModel(**RELEASED).eval()
    x = torch.rand(1, 3, frames, size, size) * 2 - 1 if what == "encode" else torch.randn(1, 32, frames, size, size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if chunk != "whole":
        vae.enable_tiling(int(chunk) if what == "encode" else 8, int(chunk) if what == "decode" else 2)
    start = time.time()
    with torch.no_grad():
        out = vae.encode(x).latent_dist.mode() if what == "encode" else vae.decode(x).sample
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"{what} {chunk}: {list(x.shape)} -> {list(out.shape)} in {time.time() - start:.1f} s; peak RSS {peak / 1e6:.2f} GB (model and input {before / 1e6:.2f} GB)")
