"""Layer 1: BERT WordPiece tokenization, identical to Google's tokens, and the vocab-model checks."""
