"""Layer 6: the commands: each module parses its flags (NVIDIA's names), checks them and calls the layers below;
`cli()` is the entry of the root script and of the console script."""
