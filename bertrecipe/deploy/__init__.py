"""Layer 5: deployment: ONNX export, Triton model repositories, what the Triton server and clients share."""
