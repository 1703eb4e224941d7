"""Layer 5: knowledge distillation of a BERT or ModernBERT into a smaller student (TinyBERT, MiniLM, DistilBERT):
the JSON config, the student-teacher layer map, capturing a model's inner states, the losses, the student."""
