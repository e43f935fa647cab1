"""Shared fixtures: a tiny random causal LM saved as a local HF model directory."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SHARED = Path(__file__).resolve().parents[2] / "shared"


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Char-level tokenizer over printable ASCII: <pad>=0, <eos>=1, <unk>=2."""
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def char_level_tokenizer(symbols: str) -> PreTrainedTokenizerFast:
    """Char-level tokenizer: <pad>=0, <eos>=1, then lowercase letters and ``symbols``."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", *string.ascii_lowercase, *symbols])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama + char tokenizer, saved with save_pretrained (loads offline)."""
    out = tmp_path_factory.mktemp("tiny-model")
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
