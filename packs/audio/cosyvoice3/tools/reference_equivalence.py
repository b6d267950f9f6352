"""Equivalence of the pack's CosyVoice3 with the reference implementation, on the same tiny weights.

Not a test (it needs the reference source and a second environment). Two processes:

1. ``ref``: in an environment with the reference's pins for the modeling code
   (transformers==4.51.3, x-transformers==2.11.24, omegaconf, scipy, einops; torch as installed)
   and a checkout of github.com/FunAudioLLM/CosyVoice (``ace7c47``) on ``--reference``: builds
   ``CosyVoice3LM`` / ``CausalMaskedDiffWithDiT`` / ``CausalHiFTGenerator`` as cosyvoice3.yaml
   does (tiny sizes), loads the pack's tiny ``llm.pt``/``flow.pt``/``hift.pt`` strictly, saves its
   outputs. Three imports the modeling code never calls are stubbed (``onnxruntime``,
   ``torchaudio``, Matcha-TTS's parameterless ``BASECFM`` base class: written to ``WORK/stubs``).
2. ``mine``: in the project environment, the pack on the same weights and inputs; prints the
   differences.

    python tools/reference_equivalence.py build --work /tmp/cv3eq          # project venv
    REF_PY tools/reference_equivalence.py ref --work /tmp/cv3eq --reference /path/to/CosyVoice
    python tools/reference_equivalence.py mine --work /tmp/cv3eq           # project venv
"""

import argparse
import functools
import sys
from pathlib import Path

import torch

STUB_BASECFM = """from abc import ABC
import torch


class BASECFM(torch.nn.Module, ABC):  # Matcha-TTS's constructor: attributes only, no parameters
    def __init__(self, n_feats, cfm_params, n_spks=1, spk_emb_dim=128):
        super().__init__()
        self.n_feats, self.n_spks, self.spk_emb_dim = n_feats, n_spks, spk_emb_dim
        self.solver = cfm_params.solver
        self.sigma_min = cfm_params.sigma_min if hasattr(cfm_params, "sigma_min") else 1e-4
        self.estimator = None
"""


def write_stubs(root: Path) -> None:
    for package in ("matcha", "matcha/models", "matcha/models/components", "onnxruntime", "torchaudio", "torchaudio/compliance"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    (root / "torchaudio/compliance/kaldi.py").touch()
    (root / "matcha/models/components/flow_matching.py").write_text(STUB_BASECFM)


parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["build", "ref", "mine"])
parser.add_argument("--work", type=Path, required=True)
parser.add_argument("--reference", type=Path, help="a CosyVoice checkout (the folder holding cosyvoice/)")
args = parser.parse_args()
torch.set_num_threads(1)
MODE = args.mode
out = args.work / "model"
S = 64
if MODE == "build":
    from mm_pack_cosyvoice3.tiny import build_tiny_checkpoint

    build_tiny_checkpoint(out, seed=0)
    sys.exit(0)
g = torch.Generator().manual_seed(0)
text = torch.randint(0, 100, (2, 6), generator=g)
text_len = torch.tensor([6, 5])
speech = torch.randint(0, S, (2, 12), generator=g)
speech_len = torch.tensor([12, 10])
x, mu, cond = (torch.randn(2, 80, 70, generator=g) for _ in range(3))
spks = torch.randn(2, 80, generator=g)
t = torch.rand(2, generator=g)
mask = torch.ones(2, 1, 70)
mask[1, :, 55:] = 0
ptok = torch.randint(0, S, (1, 5), generator=g)
pfeat = torch.randn(1, 10, 80, generator=g)
emb = torch.randn(1, 16, generator=g)
text2 = torch.randint(0, 100, (2, 7), generator=g)
text2_len = torch.tensor([7, 5])
speech2 = torch.randint(0, S, (2, 30), generator=g)
speech2_len = torch.tensor([30, 25])
inst = torch.randint(0, 100, (2, 3), generator=g)
inst_len = torch.tensor([3, 2])
MIX_SEEDS = (0, 1, 4, 10)  # per-utterance draws: both unistream, bistream + uni, both bistream, uni + bistream
r = {}
if MODE == "ref":
    write_stubs(args.work / "stubs")
    sys.path[:0] = [str(args.reference), str(args.work / "stubs")]
    import json, transformers
    from omegaconf import DictConfig
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from cosyvoice.llm.llm import CosyVoice3LM, Qwen2Encoder
    from cosyvoice.utils.common import ras_sampling
    from cosyvoice.flow.flow import CausalMaskedDiffWithDiT
    from cosyvoice.flow.flow_matching import CausalConditionalCFM
    from cosyvoice.flow.DiT.dit import DiT
    from cosyvoice.transformer.upsample_encoder import PreLookaheadLayer
    from cosyvoice.hifigan.generator import CausalHiFTGenerator
    from cosyvoice.hifigan.f0_predictor import CausalConvRNNF0Predictor

    print("reference with transformers", transformers.__version__)
    qwen = Qwen2Config(**json.loads((out / "CosyVoice-BlankEN/config.json").read_text()))
    enc = Qwen2Encoder.__new__(Qwen2Encoder)
    torch.nn.Module.__init__(enc)
    enc.model = Qwen2ForCausalLM(qwen)
    lm = CosyVoice3LM(32, 32, S, enc, functools.partial(ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1))
    flow = CausalMaskedDiffWithDiT(
        input_size=80,
        output_size=80,
        spk_embed_dim=16,
        output_type="mel",
        vocab_size=S,
        input_frame_rate=25,
        only_mask_loss=True,
        token_mel_ratio=2,
        pre_lookahead_len=3,
        pre_lookahead_layer=PreLookaheadLayer(80, 32, 3),
        decoder=CausalConditionalCFM(
            240,
            DictConfig({"sigma_min": 1e-06, "solver": "euler", "t_scheduler": "cosine", "training_cfg_rate": 0.2, "inference_cfg_rate": 0.7, "reg_loss_type": "l1"}),
            1,
            80,
            DiT(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2, mel_dim=80, mu_dim=80, spk_dim=80, out_channels=80, static_chunk_size=50, num_decoding_left_chunks=-1),
        ),
    )
    hift = CausalHiFTGenerator(
        in_channels=80,
        base_channels=32,
        nb_harmonics=8,
        sampling_rate=24000,
        nsf_alpha=0.1,
        nsf_sigma=0.003,
        nsf_voiced_threshold=10,
        upsample_rates=[8, 5, 3],
        upsample_kernel_sizes=[16, 11, 7],
        istft_params={"n_fft": 16, "hop_len": 4},
        resblock_kernel_sizes=[3, 7, 11],
        resblock_dilation_sizes=[[1, 3, 5]] * 3,
        source_resblock_kernel_sizes=[7, 7, 11],
        source_resblock_dilation_sizes=[[1, 3, 5]] * 3,
        lrelu_slope=0.1,
        audio_limit=0.99,
        conv_pre_look_right=4,
        f0_predictor=CausalConvRNNF0Predictor(1, 80, 16),
    )
    for part, module in (("llm", lm), ("flow", flow), ("hift", hift)):
        module.load_state_dict(torch.load(out / f"{part}.pt", weights_only=True), strict=True)
        module.eval()
    print("strict load of the pack's tiny llm.pt / flow.pt / hift.pt into the reference modules: OK")
    batch = {
        "text_token": text,
        "text_token_len": text_len,
        "speech_token": speech,
        "speech_token_len": speech_len,
        "instruct_token": torch.zeros(2, 1, dtype=torch.long),
        "instruct_token_len": torch.zeros(2, dtype=torch.long),
    }
    with torch.no_grad():
        r["lm_loss"] = lm(batch, torch.device("cpu"))["loss"]
        import random

        batch2 = {"text_token": text2, "text_token_len": text2_len, "speech_token": speech2, "speech_token_len": speech2_len, "instruct_token": inst, "instruct_token_len": inst_len}
        losses = []
        for seed in MIX_SEEDS:
            random.seed(seed)
            losses.append(lm(batch2, torch.device("cpu"))["loss"])
        r["lm_loss_mixed"] = torch.stack(losses)
        sos, task = lm.speech_embedding.weight[S].reshape(1, 1, -1), lm.speech_embedding.weight[S + 2].reshape(1, 1, -1)
        lm_input = torch.cat([sos, lm.llm.model.model.embed_tokens(text[:1]), task], 1)
        steps, cache, inp = [], None, lm_input
        for step in range(12):
            m = torch.tril(torch.ones((1, inp.shape[1], inp.shape[1]))).to(torch.bool)
            h, cache = lm.llm.forward_one_step(inp, masks=m, cache=cache)
            steps.append(lm.llm_decoder(h[:, -1]).log_softmax(-1))
            inp = lm.speech_embedding.weight[int(speech[0, step])].reshape(1, 1, -1)
        r["lm_step_logp"] = torch.cat(steps)

    def greedy(weighted_scores, decoded_tokens, sampling, ignore_eos=True):
        if ignore_eos:
            weighted_scores[S:] = -float("inf")  # the pack's rule below min_len (the reference masks only S)
        return int(weighted_scores.argmax())

    lm.sampling_ids = greedy
    r["greedy"] = torch.tensor(list(lm.inference_wrapper(lm_input, 25, 12, 18, "x")))

    def sampled(weighted_scores, decoded_tokens, sampling, ignore_eos=True):
        if ignore_eos:
            weighted_scores[S:] = -float("inf")
        return lm.sampling(weighted_scores, decoded_tokens, sampling)

    lm.sampling_ids = sampled
    torch.manual_seed(7)
    r["sampled"] = torch.tensor(list(lm.inference_wrapper(lm_input, 25, 40, 48, "x")))  # long enough for RAS to resample on repeats
    with torch.no_grad():
        r["dit"] = torch.stack([flow.decoder.estimator(x, mask, mu, t, spks, cond, streaming=s) for s in (False, True)])
        torch.manual_seed(5)
        r["cfm_loss"] = flow.decoder.compute_loss(x, mask, mu, spks, cond)[0]
    token = r["greedy"][None]
    r["mel"], _ = flow.inference(token, torch.tensor([token.shape[1]]), ptok, torch.tensor([5]), pfeat, torch.tensor([10]), emb, streaming=False, finalize=True)
    r["wav"], _ = hift.inference(r["mel"], finalize=True)
    r["rand_ini"], r["sine_noise"] = hift.m_source.l_sin_gen.rand_ini, hift.m_source.l_sin_gen.sine_waves[:, : r["wav"].shape[-1]].clone()
    torch.save(r, args.work / "ref.pt")
else:
    from mm_pack_cosyvoice3.model import load_pretrained
    import transformers

    ref = torch.load(args.work / "ref.pt", weights_only=True)
    mine = load_pretrained(out)
    print("pack with transformers", transformers.__version__)
    with torch.no_grad():
        r["lm_loss"] = mine.llm(text, text_len, speech, speech_len)["loss"]
        import random

        r["lm_loss_mixed"] = torch.stack([mine.llm(text2, text2_len, speech2, speech2_len, inst, inst_len, rng=random.Random(seed))["loss"] for seed in MIX_SEEDS])
        draws = [[rng.random() < 0.5 for _ in range(2)] for rng in map(random.Random, MIX_SEEDS)]
        print(f"bistream per utterance for seeds {MIX_SEEDS}: {draws}")
        lm_input = mine.llm.prompt_embeds(text[:1])
        steps, cache, inp = [], None, lm_input
        for step in range(12):
            h, cache = mine.llm.llm.step(inp, cache)
            steps.append(mine.llm.llm_decoder(h[:, -1]).log_softmax(-1))
            inp = mine.llm.speech_embedding.weight[int(speech[0, step])].reshape(1, 1, -1)
        r["lm_step_logp"] = torch.cat(steps)
    r["greedy"] = torch.tensor(list(mine.llm.generate(text[:1], sampling="greedy", min_token_text_ratio=2, max_token_text_ratio=3)))
    import mm_pack_cosyvoice3.lm as lm_module

    calls, draws, real_multinomial = [0], [0], torch.multinomial

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        draws[0] += 1
        return real_multinomial(*a, **k)

    def counted_ras(*a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real_ras(*a, **k)

    real_ras, torch.multinomial, lm_module.ras_sampling = lm_module.ras_sampling, counted, counted_ras
    r["sampled"] = torch.tensor(list(mine.llm.generate(text[:1], sampling="ras", generator=torch.Generator().manual_seed(7), min_token_text_ratio=40 / 6, max_token_text_ratio=8)))
    torch.multinomial, lm_module.ras_sampling = real_multinomial, real_ras
    with torch.no_grad():
        r["dit"] = torch.stack([mine.flow.decoder.estimator(x, mask, mu, t, spks, cond, s) for s in (False, True)])
        r["cfm_loss"] = mine.flow.decoder.compute_loss(x, mask, mu, spks, cond, torch.Generator().manual_seed(5))
    r["mel"] = mine.flow.inference(ref["greedy"][None], ptok, pfeat, emb, n_timesteps=10)
    mine.hift.m_source.fixed = {"rand_ini": ref["rand_ini"], "sine_noise": ref["sine_noise"]}
    with torch.no_grad():
        r["wav"], _ = mine.hift(ref["mel"])
    for k in ("lm_loss", "lm_loss_mixed", "lm_step_logp", "cfm_loss", "mel", "wav"):
        a, b = ref[k], r[k]
        print(f"{k}: shape {tuple(a.shape)} vs {tuple(b.shape)}, max |diff| {(a - b).abs().max().item():.3g} (max |ref| {a.abs().max().item():.3g})")
    d = (ref["dit"] - r["dit"]) * mask
    print(f"dit estimator (full / chunk mask): max |diff| {d[0].abs().max().item():.3g} / {d[1].abs().max().item():.3g}")
    print(f"greedy tokens equal: {torch.equal(ref['greedy'], r['greedy'])} ({len(r['greedy'])} tokens)")
    print(f"RAS-sampled tokens equal (seed 7): {torch.equal(ref['sampled'], r['sampled'])} ({len(r['sampled'])} tokens; {calls[0]} RAS steps, {draws[0] - calls[0]} of them resampled after a repeat)")
