"""Stock Hugging Face models nobody here wrote, built from tiny configs (offline, random weights).

The second false-alarm sweep (``tests/test_stock_sweep_round2.py``) runs every layerlab command on
them. Families the other tests do not use: decoder LMs (OPT, GPT-NeoX, Gemma, BLOOM), encoders
(ALBERT, ELECTRA, DeBERTa-v2, MPNet), encoder-decoder (BART), vision (MobileNetV2, Segformer, BEiT,
RegNet), audio (Wav2Vec2), several with a task head.

``MODELS[name]()`` returns ``(model, args, kwargs)``: a fresh model (seed 0, eval mode as built by
transformers is train mode: the caller picks) and its inputs (seed 1). Letters: B batch · T tokens ·
C channels · H, W pixels · S audio samples. Every import of ``transformers`` happens inside the
builders, so importing this module without it costs nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch

Built = Tuple[torch.nn.Module, tuple, Dict[str, Any]]
VOCAB, B, T = 64, 2, 7


def _ids() -> Dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)  # 0..2 are the special tokens below
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, -2:] = 0  # the second sample is padded: masks are part of what must not false-alarm
    return {"input_ids": ids, "attention_mask": mask}


def _pixels(size: int = 32) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(B, 3, size, size, generator=g)}


def _build(cls_name: str, config_name: str, **config: Any) -> torch.nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    return getattr(tf, cls_name)(getattr(tf, config_name)(**config))


_TEXT = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def opt() -> Built:
    return _build("OPTForCausalLM", "OPTConfig", hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                  num_attention_heads=2, max_position_embeddings=32, word_embed_proj_dim=32, **_TEXT), (), _ids()


def gpt_neox() -> Built:
    return _build("GPTNeoXForCausalLM", "GPTNeoXConfig", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, max_position_embeddings=32, **_TEXT), (), _ids()


def gemma() -> Built:
    return _build("GemmaForCausalLM", "GemmaConfig", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=32,
                  **_TEXT), (), _ids()


def bloom() -> Built:
    return _build("BloomForCausalLM", "BloomConfig", hidden_size=32, n_layer=2, n_head=2, **_TEXT), (), _ids()


def albert_cls() -> Built:
    return _build("AlbertForSequenceClassification", "AlbertConfig", embedding_size=16, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                  num_labels=3, **_TEXT), (), _ids()


def electra_tok() -> Built:
    return _build("ElectraForTokenClassification", "ElectraConfig", embedding_size=16, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                  num_labels=5, **_TEXT), (), _ids()


def deberta_v2() -> Built:
    return _build("DebertaV2Model", "DebertaV2Config", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=32, relative_attention=True,
                  pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16, **_TEXT), (), _ids()


def mpnet() -> Built:
    return _build("MPNetModel", "MPNetConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=32, **_TEXT), (), _ids()


def bart() -> Built:
    model = _build("BartForConditionalGeneration", "BartConfig", d_model=32, encoder_layers=1, decoder_layers=1,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   max_position_embeddings=32, decoder_start_token_id=2, forced_eos_token_id=2, **_TEXT)
    inputs = _ids()
    inputs["decoder_input_ids"] = inputs["input_ids"][:, :5]
    return model, (), inputs


def mobilenet_v2() -> Built:
    return _build("MobileNetV2ForImageClassification", "MobileNetV2Config", image_size=32, depth_multiplier=0.25,
                  num_labels=4), (), _pixels()


def segformer() -> Built:
    return _build("SegformerForSemanticSegmentation", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1],
                  sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2],
                  num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3), (), _pixels()


def beit() -> Built:
    return _build("BeitForImageClassification", "BeitConfig", image_size=32, patch_size=8, hidden_size=32,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, use_relative_position_bias=True,
                  num_labels=3), (), _pixels()


def regnet() -> Built:
    return _build("RegNetForImageClassification", "RegNetConfig", embedding_size=8, hidden_sizes=[8, 16],
                  depths=[1, 1], groups_width=8, num_labels=3), (), _pixels()


def wav2vec2() -> Built:
    model = _build("Wav2Vec2Model", "Wav2Vec2Config", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                   num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, mask_time_prob=0.0)
    g = torch.Generator().manual_seed(1)
    return model, (), {"input_values": torch.randn(B, 400, generator=g)}


def mixtral() -> Built:
    """A mixture of experts: 4 experts, top-2 routing (a token's experts are picked by argmax)."""
    return _build("MixtralForCausalLM", "MixtralConfig", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=32, **_TEXT), (), _ids()


def mamba() -> Built:
    """A state-space model (selective scan in its slow, pure-torch path on CPU)."""
    return _build("MambaForCausalLM", "MambaConfig", hidden_size=32, num_hidden_layers=2, state_size=8,
                  expand=2, conv_kernel=4, time_step_rank=4, **_TEXT), (), {"input_ids": _ids()["input_ids"]}


def marian() -> Built:
    """An encoder-decoder translation model (sinusoidal positions, a final logits bias)."""
    model = _build("MarianMTModel", "MarianConfig", d_model=32, encoder_layers=1, decoder_layers=1,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   max_position_embeddings=32, decoder_start_token_id=0, vocab_size=VOCAB, pad_token_id=0,
                   eos_token_id=2, bos_token_id=1, forced_eos_token_id=2)
    inputs = _ids()
    inputs["decoder_input_ids"] = inputs["input_ids"][:, :5]
    return model, (), inputs


def mobilevit() -> Built:
    """A mobile vision model: inverted residuals, then transformer blocks over unfolded patches."""
    # 64 × 64 pixels and 1-pixel patches: the last stage's 2 × 2 map is 4 tokens (at 32 pixels it is 1,
    # and a softmax over one key gives query and key an exactly-zero gradient: true, but degenerate)
    return _build("MobileViTForImageClassification", "MobileViTConfig", image_size=64, patch_size=1,
                  hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2,
                  num_labels=3), (), _pixels(64)


def wavlm() -> Built:
    """Audio: WavLM's gated relative position bias; its attention runs through F.multi_head_attention_forward."""
    model = _build("WavLMModel", "WavLMConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                   num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, num_buckets=16,
                   max_bucket_distance=32, mask_time_prob=0.0, layerdrop=0.0)
    g = torch.Generator().manual_seed(1)
    return model, (), {"input_values": torch.randn(B, 400, generator=g)}


def patchtst() -> Built:
    """A time-series forecaster: patches of a multivariate series, a linear head per horizon."""
    model = _build("PatchTSTForPrediction", "PatchTSTConfig", num_input_channels=3, context_length=32,
                   patch_length=8, patch_stride=8, prediction_length=6, d_model=16, num_attention_heads=2,
                   num_hidden_layers=1, ffn_dim=32)
    g = torch.Generator().manual_seed(1)
    return model, (), {"past_values": torch.randn(B, 32, 3, generator=g)}


def siglip() -> Built:
    """A dual-encoder contrastive model: text and image towers, a sigmoid pairwise loss."""
    import transformers as tf

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=T, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
                  patch_size=8)
    model = tf.SiglipModel(tf.SiglipConfig(text_config=text, vision_config=vision))
    inputs = {"input_ids": _ids()["input_ids"], **_pixels()}
    return model, (), inputs


#: The third sweep's kinds: a MoE, a state-space model, translation, mobile vision, audio, time series,
#: a dual encoder (``tests/test_stock_sweep_round3.py``).
ROUND3 = ["mixtral", "mamba", "marian", "mobilevit", "wavlm", "patchtst", "siglip"]


MODELS: Dict[str, Callable[[], Built]] = {
    "opt": opt, "gpt_neox": gpt_neox, "gemma": gemma, "bloom": bloom,
    "albert_cls": albert_cls, "electra_tok": electra_tok, "deberta_v2": deberta_v2, "mpnet": mpnet,
    "bart": bart,
    "mobilenet_v2": mobilenet_v2, "segformer": segformer, "beit": beit, "regnet": regnet,
    "wav2vec2": wav2vec2,
    "mixtral": mixtral, "mamba": mamba, "marian": marian, "mobilevit": mobilevit, "wavlm": wavlm,
    "patchtst": patchtst, "siglip": siglip,
}
