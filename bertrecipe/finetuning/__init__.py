"""Layer 4: fine-tuning: the loop, model loading and outputs, SQuAD (features, answers, metrics), GLUE."""
