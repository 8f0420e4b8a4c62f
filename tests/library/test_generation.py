"""Generation attribution: greedy continuation, the prefix corpus, and the
steps x sources matrix of every method, its plot and its HTML page."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.interface.generation import attribute_generation, greedy_continuation, left_pad, prefix_batches
from captum_diffmask.methods import IntegratedGradients, Occlusion, RandomAttribution

from tiny_models import LM_KINDS, tiny_causal_lm

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")
PROMPT = [5, 17, 33, 8]


@pytest.mark.parametrize("kind", LM_KINDS)
def test_greedy_continuation_is_huggingfaces_greedy_generate(kind):
    model = tiny_causal_lm(kind)
    generated = greedy_continuation(model, PROMPT, 6)
    expected = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert generated.tolist() == expected[0, len(PROMPT):].tolist()


def test_prefix_batches_hold_every_prefix_that_precedes_a_generated_token():
    batches = prefix_batches([[1, 2, 3, 4, 5], [6, 7, 8]], prompt_lengths=[3, 1], batch_size=3)
    rows = [ids[r][mask[r] == 1].tolist() for ids, mask in batches for r in range(len(ids))]
    assert rows == [[1, 2, 3], [1, 2, 3, 4], [6], [6, 7]]
    ids, mask = batches[0]
    assert (mask[:, -1] == 1).all()  # left-padded: every prefix ends at the last column
    with pytest.raises(ValueError, match="prompt_lengths"):
        prefix_batches([[1, 2]], prompt_lengths=2)


def test_left_pad_puts_padding_first():
    ids, mask = left_pad([torch.tensor([3, 4]), torch.tensor([5])])
    assert ids.tolist() == [[3, 4], [0, 5]] and mask.tolist() == [[1, 1], [0, 1]]


@pytest.mark.parametrize("kind", LM_KINDS)
def test_each_step_is_the_methods_attribution_of_its_prefix(kind, tmp_path):
    model = tiny_causal_lm(kind)
    method = Occlusion(model)
    result = attribute_generation(model, method, PROMPT, max_new_tokens=4)
    steps, sources = 4, len(PROMPT) + 3
    assert result.scores.shape == (steps, sources) and result.defined.shape == (steps, sources)
    assert result.defined.sum(1).tolist() == [4, 5, 6, 7]
    assert (result.scores[~result.defined] == 0).all()
    sequence = result.ids
    for step in range(steps):
        prefix = sequence[: len(PROMPT) + step].unsqueeze(0)
        alone = method.attribute(prefix, additional_forward_args=(torch.ones_like(prefix),), layer=0)
        assert torch.allclose(result.scores[step, : prefix.shape[1]], alone[0], atol=1e-5)
    assert result.step_tokens == [str(t) for t in result.generated_ids.tolist()]


def test_gradient_methods_attribute_the_generated_token():
    model = tiny_causal_lm("gpt2")
    cont = torch.tensor([9, 11, 40])  # not the greedy tokens: the target must follow them
    result = attribute_generation(model, IntegratedGradients(model), PROMPT, continuation=cont, n_steps=8)
    prefix = torch.tensor([PROMPT + [9]])
    alone = IntegratedGradients(model).attribute(prefix, target=11, additional_forward_args=(torch.ones_like(prefix),),
                                                 n_steps=8)
    assert torch.allclose(result.scores[1, :5], alone[0], atol=1e-5)


def test_diffmask_every_layer_plot_and_html(tmp_path):
    model = tiny_causal_lm("llama")
    sequences = [torch.tensor(PROMPT + [9, 11, 40]), torch.tensor([7, 7, 21, 30, 2])]
    dm = DiffMask(model, mode="hidden")
    dm.fit(prefix_batches(sequences, prompt_lengths=2), max_steps=3, seed=0, convergence={"until_converged": False},
           verbose=False)
    result = attribute_generation(model, dm, PROMPT, max_new_tokens=3, layer=None)
    assert result.scores.shape == (3, len(PROMPT) + 2, dm.num_layers + 1) and result.layers == [0, 1, 2]
    assert ((result.scores >= 0) & (result.scores <= 1)).all()
    result.plot(tmp_path / "generation.png")
    page = result.to_html(tmp_path / "generation.html")
    assert (tmp_path / "generation.png").stat().st_size > 0
    assert (tmp_path / "generation.html").read_text() == page
    assert page.count("<table") == 3 and "<script" not in page and "http" not in page


def test_to_captum_gives_the_llm_attribution_result_captum_plots():
    import matplotlib

    matplotlib.use("Agg")
    model = tiny_causal_lm("gpt2")
    result = attribute_generation(model, Occlusion(model), PROMPT, max_new_tokens=3)
    captum_result = result.to_captum()
    assert captum_result.input_tokens == result.source_tokens and captum_result.output_tokens == result.step_tokens
    token_attr = torch.as_tensor(captum_result.token_attr)
    assert token_attr.shape == (3, len(PROMPT) + 2) and torch.equal(token_attr, result.scores)  # 0 after each step
    assert torch.allclose(torch.as_tensor(captum_result.seq_attr), result.scores.sum(0))
    figure, _ = captum_result.plot_token_attr(show=False)
    assert len(figure.axes) >= 1
    with pytest.raises(ValueError, match="layer: this generation holds layer 0 alone, got 2"):
        result.to_captum(layer=2)


def test_random_and_errors_name_the_argument():
    model = tiny_causal_lm("gpt2")
    result = attribute_generation(model, RandomAttribution(model), PROMPT, max_new_tokens=2)
    assert result.scores.shape == (2, len(PROMPT) + 1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        attribute_generation(model, RandomAttribution(model), PROMPT)
    with pytest.raises(ValueError, match="prompt"):
        attribute_generation(model, RandomAttribution(model), torch.zeros(2, 3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(TypeError, match="prompt must be token ids, got a string: pass tokenizer="):
        attribute_generation(model, RandomAttribution(model), "The cat", max_new_tokens=2)


def test_a_string_prompt_is_tokenised_by_the_tokenizer_given():
    from tiny_models import tiny_wordpiece

    tokenizer = tiny_wordpiece(["the", "cat", "sat"])  # ids 0..7, inside the tiny vocabulary
    model = tiny_causal_lm("gpt2")
    ids = tokenizer("the cat sat", return_tensors="pt")["input_ids"]
    from_text = attribute_generation(model, Occlusion(model), "the cat sat", max_new_tokens=2, tokenizer=tokenizer)
    from_ids = attribute_generation(model, Occlusion(model), ids, max_new_tokens=2, tokenizer=tokenizer)
    assert torch.equal(from_text.scores, from_ids.scores) and from_text.tokens == from_ids.tokens


def test_a_tokenizers_output_of_one_sequence_is_a_prompt():
    model = tiny_causal_lm("gpt2")
    ids = torch.tensor([PROMPT])
    from_mapping = attribute_generation(model, RandomAttribution(model), {"input_ids": ids}, max_new_tokens=2)
    from_ids = attribute_generation(model, RandomAttribution(model), PROMPT, max_new_tokens=2)
    assert torch.equal(from_mapping.scores, from_ids.scores)


def test_generation_words_merge_each_steps_pieces_by_the_methods_rule():
    from tiny_models import tiny_wordpiece

    tokenizer = tiny_wordpiece(["the", "cat", "##s", "sat"])  # ids 5..8
    model = tiny_causal_lm("gpt2")
    prompt = "the cats sat"  # [CLS] the cat ##s sat [SEP]
    continuation = [6, 7, 5]  # cat ##s the: the sources end with "cat ##s", one more word
    occlusion = attribute_generation(model, Occlusion(model), prompt, continuation=continuation, tokenizer=tokenizer)
    assert occlusion.words == ["the", "cats", "sat", "cats"] and occlusion.word_in_prompt == [True, True, True, False]
    assert occlusion.word_ids == [None, 0, 1, 1, 2, None, 3, 3]
    words = occlusion.word_scores
    assert words.shape == (3, 4)
    assert torch.allclose(words[:, 1], occlusion.scores[:, 2] + occlusion.scores[:, 3])  # attributions add up
    assert torch.allclose(words[:, 2], occlusion.scores[:, 4])
    # step 0 sees the prompt only; step 1 sees "cat" of the last word, step 2 all of it
    assert occlusion.word_defined[:, 3].tolist() == [False, True, True]

    dm = DiffMask(model, mode="input")
    sequence = tokenizer(prompt, return_tensors="pt")["input_ids"][0].tolist() + continuation
    dm.fit(prefix_batches([torch.tensor(sequence)], prompt_lengths=2), max_steps=2, seed=0,
           convergence={"until_converged": False}, verbose=False)
    masks = attribute_generation(model, dm, prompt, continuation=continuation, tokenizer=tokenizer)
    assert masks.probabilities and not occlusion.probabilities
    assert torch.allclose(masks.word_scores[:, 1], masks.scores[:, 2:4].max(1).values)  # a keep is not additive


def test_generation_views_show_words_and_draw_probabilities_on_their_own_scale(tmp_path):
    from captum_diffmask.interface.generation import GenerationAttribution

    def result(probabilities, word_ids=None, words=None):
        scores = torch.tensor([[0.01, 0.02, 0.0], [0.01, 0.02, 0.02]])
        defined = torch.tensor([[True, True, False], [True, True, True]])
        return GenerationAttribution(torch.arange(4), 2, scores, defined, ["an", "##t", "x", "y"], "M",
                                     None, 0, word_ids, words, probabilities)

    keep = result(True).to_html(words=False)
    assert "rgba(0,160,0,0.010)" in keep and "rgba(0,160,0,0.020)" in keep  # a near-empty mask looks empty
    scaled = result(False).to_html(words=False)
    assert "rgba(0,160,0,0.500)" in scaled and "rgba(0,160,0,1.000)" in scaled  # row's largest magnitude
    by_word = result(True, [0, 0, 1], ["ant", "x"])
    page = by_word.to_html(tmp_path / "words.html")
    assert ">ant</th>" in page and ">##t</th>" not in page
    assert by_word.matrices()[0][1].shape == (2, 2) and by_word.matrices(words=False)[0][1].shape == (2, 3)
    by_word.plot(tmp_path / "words.png")
    with pytest.raises(ValueError, match="tokenizer="):
        result(True).to_html(words=True)
    with pytest.raises(ValueError, match="no words"):
        result(True).word_scores
