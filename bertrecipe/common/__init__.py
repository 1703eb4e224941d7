"""Layer 0: error types, reading user files, the commands' one-line parser, atomic writes, output paths, the host."""
