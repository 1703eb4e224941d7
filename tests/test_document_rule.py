"""One rule for what a document is inside a row (issue 38, item 3): an unbroken run of one id. An id that comes
back later in the row is another document, for attention (which compares ids), positions (which restart at each
run) and the CUDA spans (runs in token order) alike; a second rule anywhere makes the two spellings below differ."""
import pytest
import torch

from bertrecipe.model.documents import (
    document_attention_bias,
    document_runs,
    positions_within_documents,
)
from bertrecipe.model.families import config_from_dict, pretraining_model
from bertrecipe.model.varlen_attention import document_spans

# Three documents, the first and the last both spelt 1 in one row; the same documents numbered apart in the other.
RECURRING = torch.tensor([[1, 1, 1, 2, 2, 1, 1, 1, 0, 0], [4, 4, 7, 7, 7, 7, 4, 0, 0, 0]])
APART = torch.tensor([[1, 1, 1, 2, 2, 3, 3, 3, 0, 0], [1, 1, 2, 2, 2, 2, 3, 0, 0, 0]])
FAMILIES = {
    "bert": {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 32, "max_position_embeddings": 16, "hidden_dropout_prob": 0.0,
             "attention_probs_dropout_prob": 0.0},
    "modern": {"model_type": "modernbert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 3,
               "num_attention_heads": 2, "intermediate_size": 24, "max_position_embeddings": 16,
               "local_attention": 4, "global_attn_every_n_layers": 3, "pad_token_id": 0},
}


def test_runs_are_the_documents_of_every_reader():
    runs = document_runs(RECURRING)
    assert runs.tolist() == [[1, 1, 1, 2, 2, 3, 3, 3, 0, 0], [1, 1, 2, 2, 2, 2, 3, 0, 0, 0]]
    assert torch.equal(positions_within_documents(runs), positions_within_documents(APART))
    assert torch.equal(document_attention_bias(runs, torch.float32), document_attention_bias(APART, torch.float32))
    spans = document_spans(runs, None, kernel=None)
    assert torch.equal(spans.cu_seqlens, document_spans(APART, None, kernel=None).cu_seqlens)


def encoder_output(model, family, document_ids):
    torch.manual_seed(1)
    input_ids = torch.randint(5, 64, document_ids.shape) * (document_ids > 0)
    if family == "bert":
        return model.bert(input_ids, document_ids=document_ids)[0]
    return model.model(input_ids, None, document_ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_recurring_id_is_another_document_in_both_families(family):
    torch.manual_seed(0)
    model = pretraining_model(config_from_dict(FAMILIES[family])).eval()
    with torch.no_grad():
        recurring, apart = encoder_output(model, family, RECURRING), encoder_output(model, family, APART)
        # The last document alone in its row: what packing promises each document.
        alone_ids = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
        torch.manual_seed(1)
        tokens = torch.randint(5, 64, RECURRING.shape) * (RECURRING > 0)
        alone_tokens = torch.zeros_like(alone_ids)
        alone_tokens[0, :3] = tokens[0, 5:8]
        if family == "bert":
            alone = model.bert(alone_tokens, document_ids=alone_ids)[0]
        else:
            alone = model.model(alone_tokens, None, alone_ids)
    real = RECURRING > 0
    torch.testing.assert_close(recurring[real], apart[real], rtol=0, atol=0)
    torch.testing.assert_close(recurring[0, 5:8], alone[0, :3], rtol=1e-5, atol=1e-5)
