"""Tiny config-built Hugging Face models (no download) and token batches, shared by
the tests (importable as ``tiny_models``: ``tests/`` is on pytest's path)."""

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
)
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
# One thread: the tests' models are tiny, and on a shared machine torch's default
# threading makes them up to ten times slower.
torch.set_num_threads(1)

VOCAB = 50


def tiny_bert(num_layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=num_layers, num_attention_heads=2,
        intermediate_size=37, num_labels=3, max_position_embeddings=64,
    )
    return BertForSequenceClassification(config).eval()


def tiny_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "bert":
        return tiny_bert(seed=seed)
    if kind == "roberta":
        config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=37, num_labels=3,
                               max_position_embeddings=70, pad_token_id=1)
        return RobertaForSequenceClassification(config).eval()
    if kind == "distilbert":
        config = DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                                  num_labels=3, max_position_embeddings=64)
        return DistilBertForSequenceClassification(config).eval()
    if kind == "electra":
        config = ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=37, num_labels=3,
                               max_position_embeddings=64)
        return ElectraForSequenceClassification(config).eval()
    if kind == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, num_labels=3,
                            n_positions=64, pad_token_id=0, bos_token_id=0, eos_token_id=0)
        return GPT2ForSequenceClassification(config).eval()
    raise ValueError(kind)


HF_KINDS = ["bert", "roberta", "distilbert", "electra", "gpt2"]
LM_KINDS = ["gpt2", "llama"]


def tiny_causal_lm(kind: str, seed: int = 0, num_layers: int = 2):
    """A config-built decoder-only language model: GPT-2 (absolute positions) or
    Llama (rotary positions), logits (B, T, VOCAB)."""
    from transformers import GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=num_layers, n_head=2, n_positions=64,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return GPT2LMHeadModel(config).eval()
    if kind == "llama":
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=num_layers, num_attention_heads=2,
                             num_key_value_heads=2, intermediate_size=37, max_position_embeddings=64,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
        return LlamaForCausalLM(config).eval()
    raise ValueError(kind)


def left_padded(prompts):
    """Prompts of several lengths (lists of ids) as one left-padded batch (the
    library's ``left_pad``): ids (B, T) with 0 at the padding, and the attention mask."""
    from captum_diffmask.generation import left_pad

    return left_pad([torch.tensor(p) for p in prompts])


def token_batch(batch: int = 4, length: int = 9, seed: int = 0):
    """Token ids (B, T) and an attention mask with padding at the end of some rows."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length - 3:] = 0
    mask[-1, length - 1:] = 0
    ids[mask == 0] = 0
    return ids, mask


def shared_sst():
    r"""The folder of the shared SST files (``../shared/data`` beside the checkout,
    or ``$CAPTUM_DIFFMASK_DATA``), or None when train.txt/dev.txt are not there."""
    from benchmarks.tasks.sst import default_data_dir, resolve_data_dir, SSTDataError

    try:
        return resolve_data_dir(default_data_dir(), ("train", "dev"))
    except SSTDataError:
        return None
