"""ONNX export of the unrolled ODE attention block, and inference with ONNX Runtime."""
