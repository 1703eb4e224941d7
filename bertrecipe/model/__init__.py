"""Layer 2: the BERT model (config, encoder, heads) and its weights in our, NVIDIA's and Hugging Face formats."""
