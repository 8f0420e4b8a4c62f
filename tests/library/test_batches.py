"""Batches: what reaches the model from tuples, tokenizer dicts and data-collator
dicts; targets are recognised and never fed to the model."""

import pytest
import torch

from captum_diffmask import DiffMask
from captum_diffmask.model.batches import split_batch
from captum_diffmask.model.forward import ModelForward
from captum_diffmask.evaluation.toy_task import generate_toy_data, ToyModel

from tiny_models import tiny_bert, token_batch

pytestmark = pytest.mark.filterwarnings("ignore::captum_diffmask.DiffMaskConvergenceWarning")


def test_labels_in_a_tuple_never_reach_a_hugging_face_model_even_when_batch_size_equals_length():
    ids, mask = token_batch(batch=4, length=4)  # B == T: labels (B,) would have fit a (B, T) slot by count only
    labels = torch.tensor([0, 2, 1, 1])
    forward = ModelForward(tiny_bert())
    seen_ids, extra = forward.split_batch((ids, mask, labels))
    assert seen_ids is ids and len(extra) == 1 and extra[0] is mask
    types = torch.zeros_like(ids)
    assert forward.split_batch((ids, mask, types, labels))[1] == (mask, types)


def test_a_dict_batch_maps_keys_and_drops_targets_and_text_keys():
    ids, mask = token_batch()
    forward = ModelForward(tiny_bert())
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.zeros(4, dtype=torch.long),
             "special_tokens_mask": torch.zeros_like(ids)}
    assert forward.split_batch(batch)[1] == (mask,)
    types = torch.zeros_like(ids)
    assert forward.split_batch({"input_ids": ids, "token_type_ids": types})[1] == (None, types)
    with pytest.raises(ValueError, match=r"keys \['position_ids'\] cannot be given to the model"):
        forward.split_batch({"input_ids": ids, "position_ids": types})
    with pytest.raises(ValueError, match="needs the key 'input_ids'"):
        forward.split_batch({"ids": ids})


def test_an_unreadable_tuple_says_how_to_pass_the_batch():
    ids, mask = token_batch()
    forward = ModelForward(tiny_bert())
    with pytest.raises(ValueError, match="pass the batch as a dict with the keys input_ids"):
        forward.split_batch((ids, mask, torch.zeros(4, 5), torch.zeros(4)))
    # token-classification labels (B, T) where token_type_ids would be read: refused, not fed
    with pytest.raises(ValueError, match="token_type_ids holds values -100..2"):
        forward.split_batch((ids, mask, torch.full_like(ids, -100).index_fill_(1, torch.tensor([0]), 2)))


def test_a_plain_module_takes_its_extras_positionally_and_one_more_is_a_target():
    data = generate_toy_data(16, seed=0)
    forward = ModelForward(ToyModel())  # forward(ids, query, mask)
    labels = torch.ones(16)
    assert len(forward.split_batch((data.ids, data.query, data.mask, labels))[1]) == 2
    with pytest.raises(ValueError, match="takes 2 after the ids"):
        forward.split_batch((data.ids, data.query, data.mask, labels, labels))
    with pytest.raises(TypeError, match="batch must be token ids"):
        split_batch("text", hf_model=False)


def test_fit_and_attribute_read_collator_dicts_and_labelled_tuples_the_same_way():
    model = tiny_bert()
    ids, mask = token_batch()
    labels = torch.tensor([0, 1, 2, 0])
    fits = {}
    for name, batch in {"tuple": (ids, mask), "labelled": (ids, mask, labels),
                        "dict": {"input_ids": ids, "attention_mask": mask, "labels": labels}}.items():
        dm = DiffMask(model, mode="hidden")
        dm.fit([batch] * 3, max_steps=6, seed=0, convergence={"until_converged": False}, verbose=False)
        fits[name] = dm.attribute(ids, additional_forward_args=(mask,), layer=None)
    assert torch.equal(fits["tuple"], fits["labelled"]) and torch.equal(fits["tuple"], fits["dict"])
    dm = DiffMask(model, mode="hidden")
    dm.fit([(ids, mask)] * 3, max_steps=6, seed=0, convergence={"until_converged": False}, verbose=False)
    from_dict = dm.attribute({"input_ids": ids, "attention_mask": mask, "labels": labels}, layer=2)
    assert torch.equal(from_dict, dm.attribute(ids, additional_forward_args=(mask,), layer=2))
    with pytest.raises(ValueError, match="additional_forward_args must be None"):
        dm.attribute({"input_ids": ids}, additional_forward_args=(mask,), layer=2)


def test_attribute_reads_a_batch_tuple_as_it_reads_ids_and_extras():
    from captum_diffmask.methods import IntegratedGradients, Occlusion

    model = tiny_bert()
    ids, mask = token_batch()
    for method in (Occlusion(model), IntegratedGradients(model)):
        split = method.attribute(ids, additional_forward_args=(mask,), layer=1)
        whole = method.attribute((ids, mask), layer=1)
        assert isinstance(whole, torch.Tensor) and torch.allclose(whole, split)  # one tensor: the mask is not scored
        assert (whole[mask == 0] == 0).all() and (whole[mask == 1] != 0).any()
        with pytest.raises(ValueError, match="additional_forward_args must be None when inputs is a batch tuple"):
            method.attribute((ids, mask), additional_forward_args=(mask,))
    assert isinstance(Occlusion(model).attribute((ids,)), tuple)  # Captum's 1-tuple in, 1-tuple out


def test_a_padding_mask_other_than_0_and_1_and_a_row_of_padding_are_refused():
    from captum_diffmask.methods import Occlusion

    model = tiny_bert()
    ids, mask = token_batch()
    occlusion = Occlusion(model)
    with pytest.raises(ValueError, match=r"additional_forward_args\[0\] is the padding mask and must hold 0 .* "
                                         r"got the values \[0.0, 1.0, 2.0\]"):
        occlusion.attribute(ids, additional_forward_args=(mask.masked_fill(mask == 1, 2).index_fill(1, torch.tensor([0]), 1),))
    empty = mask.clone()
    empty[2] = 0
    with pytest.raises(ValueError, match="inputs: row 2 has no real token"):
        occlusion.attribute(ids, additional_forward_args=(empty,))
    as_bool = occlusion.attribute(ids, additional_forward_args=(mask.bool(),))
    assert torch.allclose(as_bool, occlusion.attribute(ids, additional_forward_args=(mask,)))
