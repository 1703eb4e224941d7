"""The modern family's attention through the varlen kernel (bertrecipe/model/varlen_attention.py).

On a CPU the model's glue around the kernel (token order, document spans, rotary angles per token, the layout of
the context) is checked with a plain-Python varlen attention written here in the kernel's place: the model must give
the logits and gradients of its usual bias/Band path. On a GPU (tests marked cuda) torch's own kernel is checked
against the same usual path in bf16, and shown to be the one that runs.
"""
from __future__ import annotations

import math

import pytest
import torch

from bertrecipe.model import modern, varlen_attention
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig

CONFIG = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_hidden_layers=3, intermediate_size=48,
              local_attention=8, max_position_embeddings=128, pad_token_id=0, model_type="modernbert")


def reference_varlen(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, window_size=(-1, -1)):
    """Each document of the token order alone: softmax(q k^T / sqrt(d)) v over its keys, those within the
    window (left, right) of the query where it is given."""
    assert torch.equal(cu_seq_q, cu_seq_k) and cu_seq_q.dtype == torch.int32
    out = torch.empty_like(q)
    bounds = cu_seq_q.tolist()
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    assert max_q == max_k == max(end - start for start, end in spans)
    for start, end in spans:
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [heads, length, dim]
        scores = qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1])
        if window_size != (-1, -1):
            index = torch.arange(end - start)
            offset = index[None, :] - index[:, None]  # key minus query
            outside = (offset < -window_size[0]) | (offset > window_size[1])
            scores = scores.masked_fill(outside, float("-inf"))
        out[start:end] = (scores.softmax(-1) @ vd).transpose(0, 1)
    return out


def model(seed: int = 3) -> ModernBertForMaskedLM:
    torch.manual_seed(seed)
    net = ModernBertForMaskedLM(ModernBertConfig.from_dict(CONFIG)).eval()
    with torch.no_grad():  # weights far from their init, so that every path changes the logits visibly
        for param in net.parameters():
            param.normal_(0.0, 0.3)
    return net


def packed_batch(generator: torch.Generator, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 40 tokens holding documents of several lengths (one past the local window), padding at the end
    of the first row where `padded`."""
    document_ids = torch.tensor([[1] * 5 + [2] * 20 + [3] * 7 + ([0] * 8 if padded else [4] * 8),
                                 [1] * 3 + [2] * 37])
    ids = torch.randint(3, 128, document_ids.shape, generator=generator) * (document_ids > 0)
    return ids, document_ids


def run(net: ModernBertForMaskedLM, ids: torch.Tensor, document_ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    net.zero_grad(set_to_none=True)
    logits = net(ids, document_ids=document_ids).prediction_logits
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))
    (logits * weights * (document_ids > 0)[..., None]).sum().backward()
    return logits.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("padded", [True, False])
def test_the_varlen_path_gives_the_usual_logits_and_gradients(monkeypatch, padded):
    """With a plain-Python varlen attention in the kernel's place, the model's spans, rotary angles and layout give
    what its bias and Band path give (local and global layers; padding skipped, or none to skip)."""
    ids, document_ids = packed_batch(torch.Generator().manual_seed(1), padded)
    net = model()
    usual_logits, usual_grads = run(net, ids, document_ids)
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs.get("window_size"))
        return reference_varlen(*args, **kwargs)

    monkeypatch.setattr(modern, "kernel_for", lambda *args, **kwargs: counted)
    varlen_logits, varlen_grads = run(net, ids, document_ids)
    assert set(calls) == {None, (4, 4)}  # global and local layers both went through it
    real = document_ids > 0
    assert torch.allclose(varlen_logits[real], usual_logits[real], atol=1e-5, rtol=1e-5)
    for got, expected in zip(varlen_grads, usual_grads, strict=True):
        assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_document_spans_follow_rows_and_documents():
    """cu_seqlens against a plain count: a document ends where its id or its row does, padding is not a token."""
    document_ids = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1], [3, 3, 0, 0, 0, 0]])
    index = (document_ids > 0).reshape(-1).nonzero().squeeze(1)
    spans = varlen_attention.document_spans(document_ids, index, reference_varlen)
    assert spans.cu_seqlens.tolist() == [0, 2, 5, 11, 13] and spans.cu_seqlens.dtype == torch.int32
    assert spans.max_length == 6
    # the same id at the end of one row and the start of the next: two documents
    every_position = varlen_attention.document_spans(torch.tensor([[1, 1, 2], [2, 2, 1]]), None, reference_varlen)
    assert every_position.cu_seqlens.tolist() == [0, 2, 3, 5, 6]


@pytest.mark.parametrize("device, dtype, head_dim, dropout, training", [
    ("cpu", torch.bfloat16, 64, 0.0, True),  # no kernel on CPUs
    ("cuda", torch.float32, 64, 0.0, True),  # FlashAttention takes bf16 and fp16 only
    ("cuda", torch.bfloat16, 512, 0.0, True),  # heads wider than 256
    ("cuda", torch.bfloat16, 60, 0.0, True),  # not a multiple of 8
    ("cuda", torch.float16, 64, 0.1, True),  # attention dropout while training: the kernel has none
])
def test_no_varlen_kernel_where_it_cannot_serve(device, dtype, head_dim, dropout, training):
    assert varlen_attention.kernel_for(torch.device(device), dtype, head_dim, dropout, training, local=False) is None


@pytest.mark.cuda
def test_torch_varlen_kernel_runs_the_modern_model_on_cuda(monkeypatch):
    """On a GPU in bf16, torch's varlen kernel (asked for, and called) gives the usual path's logits and gradients
    within bf16's precision."""
    if varlen_attention.kernel_for(torch.device("cuda"), torch.bfloat16, 8, 0.0, True, local=False) is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    ids, document_ids = (t.cuda() for t in packed_batch(torch.Generator().manual_seed(1), padded=True))
    net = model().cuda()
    served: dict[bool, bool] = {}  # local layers? -> the kernel served them
    real_kernel_for = varlen_attention.kernel_for

    def spied(*args, local: bool):
        kernel = real_kernel_for(*args, local=local)
        served[local] = kernel is not None
        return kernel

    monkeypatch.setattr(modern, "kernel_for", spied)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        varlen_logits, varlen_grads = run(net, ids, document_ids)
    # global layers always; local ones where the installed torch's kernel takes a window
    from torch.nn.attention.varlen import varlen_attn  # importable here: kernel_for found it above

    assert served == {False: True, True: varlen_attention.takes_a_window(varlen_attn)}
    monkeypatch.setattr(modern, "kernel_for", lambda *args, **kwargs: None)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        usual_logits, usual_grads = run(net, ids, document_ids)
    real = document_ids > 0
    scale = usual_logits[real].float().abs().max()
    assert (varlen_logits[real].float() - usual_logits[real].float()).abs().max() <= 2e-2 * scale
    for got, expected in zip(varlen_grads, usual_grads, strict=True):
        assert (got - expected).abs().max() <= 5e-2 * expected.abs().max() + 1e-6
