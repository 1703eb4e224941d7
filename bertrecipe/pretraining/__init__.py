"""Layer 4: pre-training: the shard schema, the sample order, batches and the loss, dynamic masking, the loop,
its start-up and the resume rules."""
