"""A tiny random-weight CosyVoice3 checkpoint in the public layout, for tests (offline, seconds).

The yaml is the public ``cosyvoice3.yaml``'s model part with the same tags, references and
field names and tiny sizes; the three state dicts are written with torch.save as the reference
writes them; ``CosyVoice-BlankEN/`` holds a tiny Qwen2 config and a byte-level BPE tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_YAML = """\
# tiny CosyVoice3 (the public cosyvoice3.yaml's model fields, random weights)
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 16
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_tokens}
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {speech_tokens}
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: 32
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: 2
            heads: {dit_heads}
            dim_head: {dit_dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_channels}
"""

CORPUS = ["hello world, this is a tiny speech test.", "the quick brown fox jumps over the lazy dog.", "CosyVoice three speaks text as speech tokens."] * 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|endofprompt|>"]


def write_tokenizer(out: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE Qwen2 tokenizer trained on a few sentences; returns its size with specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    out.mkdir(parents=True, exist_ok=True)
    tok = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, unk_token=None, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.save_pretrained(out)
    return len(tok)


def build_tiny_checkpoint(
    out_dir: Path, seed: int = 0, hidden: int = 32, speech_tokens: int = 64, tie_word_embeddings: bool = True, hift_channels: int = 32, f0_channels: int = 16, dit_dim: int = 32, dit_heads: int = 2
) -> Path:
    """Write the tiny folder (yaml, llm.pt, flow.pt, hift.pt, CosyVoice-BlankEN/) and return it."""
    from transformers import Qwen2Config

    from mm_pack_cosyvoice3.model import QWEN_DIR, YAML, CosyVoice3, read_configs, save_public

    out_dir = Path(out_dir)
    qwen_dir = out_dir / QWEN_DIR
    vocab = write_tokenizer(qwen_dir)
    qwen = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
    )
    qwen_dir.mkdir(parents=True, exist_ok=True)
    qwen.to_json_file(str(qwen_dir / "config.json"))
    (out_dir / YAML).write_text(
        TINY_YAML.format(hidden=hidden, speech_tokens=speech_tokens, hift_channels=hift_channels, f0_channels=f0_channels, dit_dim=dit_dim, dit_heads=dit_heads, dit_dim_head=dit_dim // dit_heads)
    )
    cfg, qwen = read_configs(out_dir)
    torch.manual_seed(seed)
    model = CosyVoice3(cfg, qwen)
    with torch.no_grad():  # weight-norm gains and Snake alphas of a trained model are not all ones
        for name, p in model.named_parameters():
            if name.endswith(("original0", ".alpha")):
                p.mul_(0.5 + torch.rand_like(p))
    save_public(model, out_dir)
    return out_dir
