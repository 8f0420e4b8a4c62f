"""Tiny config-built Hugging Face models (no download) and token batches, shared by
the tests (importable as ``tiny_models``: ``tests/`` is on pytest's path)."""

import pytest
import torch
from transformers import (
    BertConfig, BertForSequenceClassification, DistilBertConfig, DistilBertForSequenceClassification, ElectraConfig,
    ElectraForSequenceClassification, GPT2Config, GPT2ForSequenceClassification, RobertaConfig,
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


SEQ2SEQ_KINDS = ["t5", "bart", "marian"]


def tiny_seq2seq(kind: str, seed: int = 0):
    """A config-built encoder-decoder language model: T5 (relative positions),
    BART (learned positions, offset 2) or Marian (sinusoidal positions), two
    encoder blocks, logits (B, D, VOCAB) over the decoder's prefix."""
    import transformers as hf

    torch.manual_seed(seed)
    sizes = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 37, "decoder_ffn_dim": 37, "max_position_embeddings": 64}
    if kind == "t5":
        config = hf.T5Config(vocab_size=VOCAB, d_model=32, num_layers=2, num_decoder_layers=2, num_heads=2, d_ff=37,
                             d_kv=16, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        return hf.T5ForConditionalGeneration(config).eval()
    if kind == "bart":
        config = hf.BartConfig(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                               decoder_start_token_id=2, forced_eos_token_id=None, **sizes)
        return hf.BartForConditionalGeneration(config).eval()
    if kind == "marian":
        config = hf.MarianConfig(vocab_size=VOCAB, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1,
                                 eos_token_id=0, **sizes)
        return hf.MarianMTModel(config).eval()
    raise ValueError(kind)


def left_padded(prompts):
    """Prompts of several lengths (lists of ids) as one left-padded batch (the
    library's ``left_pad``): ids (B, T) with 0 at the padding, and the attention mask."""
    from captum_diffmask.interface.generation import left_pad

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
    r"""The folder of the SST files as the suites find it (``$CAPTUM_DIFFMASK_DATA``,
    else ``../shared/data`` beside the checkout), or None when train.txt/dev.txt
    are not there (a fresh clone)."""
    from benchmarks.tasks.sst import resolve_data_dir, SSTDataError

    try:
        return resolve_data_dir(None, ("train", "dev"))
    except SSTDataError:
        return None


SST_MISSING = ("SST train.txt/dev.txt not found ($CAPTUM_DIFFMASK_DATA, else ../shared/data beside the checkout); "
               "a fresh clone has no data")
#: Marks a test that reads the SST files: skipped, with the reason, where they are not.
needs_sst = pytest.mark.skipif(shared_sst() is None, reason=SST_MISSING)


def require_sst():
    r"""Skips the calling test or fixture when the SST files are not there."""
    if shared_sst() is None:
        pytest.skip(SST_MISSING)


def tiny_wordpiece(words):
    """A fast uncased WordPiece tokenizer over ``words`` (plus BERT's special
    tokens), built with no download."""
    import inspect
    import tempfile
    from pathlib import Path

    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    if "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters:  # transformers 5
        return BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    with tempfile.TemporaryDirectory() as folder:  # transformers 4 reads a file
        path = Path(folder) / "vocab.txt"
        path.write_text("\n".join(vocab) + "\n")
        return BertTokenizerFast(vocab_file=str(path), do_lower_case=True)


def every_method(ig_options):
    """name -> (factory or None for DiffMask, attribute options, deterministic) for
    the tests that run every method on one model; ``ig_options`` are IG's
    attribute options. The stochastic methods draw noise of the batch's shape, so
    padding changes their draws (not their objective)."""
    from captum_diffmask.methods import (
        ExactErasure, Guan, IntegratedGradients, Occlusion, PerExampleDiffMask, PerSampleBottleneck,
        RandomAttribution, ReadoutBottleneck, REINFORCE,
    )

    few = {"steps": 5, "verbose": False}
    return {
        "DiffMask": (None, {}, True),
        "IntegratedGradients": (lambda m: IntegratedGradients(m), dict(ig_options), True),
        "Occlusion": (lambda m: Occlusion(m), {}, True),
        "ExactErasure": (lambda m: ExactErasure(m, verbose=False), {}, True),
        "PerSampleBottleneck": (lambda m: PerSampleBottleneck(m), few, False),
        "ReadoutBottleneck": (lambda m: ReadoutBottleneck(m), {}, True),
        "Guan": (lambda m: Guan(m), few, False),
        "PerExampleDiffMask": (lambda m: PerExampleDiffMask(m), few, False),
        "REINFORCE": (lambda m: REINFORCE(m), few, False),
        "Random": (lambda m: RandomAttribution(m), {}, False),
    }


def prepared_method(methods, name, model, batch, layers):
    """The method ``name`` of ``methods`` (:func:`every_method`) ready to attribute
    ``batch`` (a tuple of ids and forward arguments) at ``layers``: DiffMask fitted
    for a few steps in hidden mode, the bottleneck's statistics fitted; and its
    attribute options."""
    from captum_diffmask import DiffMask

    factory, options, _ = methods[name]
    if name == "DiffMask":
        method = DiffMask(model, mode="hidden")
        method.fit([batch] * 2, max_steps=4, seed=0, convergence={"until_converged": False}, verbose=False)
        return method, options
    method = factory(model)
    if name == "PerSampleBottleneck":
        for layer in layers:
            method.fit_statistics([batch], layer=layer)
    if name == "ReadoutBottleneck":
        method.fit([batch] * 2, layers=list(layers), epochs=1, seed=0, verbose=False)
    return method, options


def query_minus_other(scores, truth, mask):
    """Per example: the mean score at the toy task's query digits minus the mean
    at the other real positions, over examples that have both."""
    query = truth.bool()
    other = mask.bool() & ~query
    both = query.any(1) & other.any(1)
    q = (scores * query).sum(1) / query.sum(1).clamp(min=1)
    o = (scores * other).sum(1) / other.sum(1).clamp(min=1)
    return (q - o)[both]


def sensitized(model):
    r"""``model`` with weights large enough (N(0, 0.3) in every matrix, drawn from
    a fixed generator) that one head or MLP unit moves the logits."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model
