"""Layer 3: what every loop shares: the Stepper (precision, accumulation, DDP), LAMB/AdamW and schedules,
checkpoints, process groups, logs, the run lock."""
