"""BERT pre-training and fine-tuning, a drop-in for NVIDIA's PyTorch BERT: the library behind the root commands
(bertrecipe/README.md maps its layers and modules)."""
