"""The HDF5 pre-training shard (docs/interfaces.md, section 1), in one place: bertrecipe/dataprep/shard_writer.py
writes it and bertrecipe/pretraining/data.py reads it. Six arrays of whole rows, one row a sequence."""
import numpy as np

FORMAT_VERSION = 1  # the shard's `format_version` attribute
# Array name -> (dtype, number of dimensions).
SHARD_ARRAYS = {
    "input_ids": (np.int32, 2),
    "input_mask": (np.int8, 2),
    "segment_ids": (np.int8, 2),
    "masked_lm_positions": (np.int32, 2),
    "masked_lm_ids": (np.int32, 2),
    "next_sentence_labels": (np.int8, 1),
}
SHARD_KEYS = tuple(SHARD_ARRAYS)
