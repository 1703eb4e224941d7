"""Data preparation for BERT pre-training: text -> formatted corpus -> shards -> HDF5 instances."""
