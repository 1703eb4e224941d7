"""The BERT model where NVIDIA's layout puts it (their modeling.py), for `from model import BertForPreTraining` at
the root. The code is bertrecipe/model/bert.py: read it there; nothing in the package imports this file."""
from bertrecipe.model.bert import (
                                   BertConfig,
                                   BertForPreTraining,
                                   BertForQuestionAnswering,
                                   BertForSequenceClassification,
                                   BertModel,
                                   PreTrainingOutput,
)

__all__ = ["BertConfig", "BertForPreTraining", "BertForQuestionAnswering", "BertForSequenceClassification",
           "BertModel", "PreTrainingOutput"]
