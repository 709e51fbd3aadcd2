"""The kernel families: the one table of names a trace reports for what ran, a path claims, and the
``lstmperf_kernel`` marker accepts."""

from __future__ import annotations

#: what a trace can observe; every family but the last two is a kernel a path or a marker can claim
KERNEL_FAMILIES = (
    "cudnn",  # torch aten::_cudnn_rnn / TF CudnnRNNV3
    "cuda-generic",  # torch per-step cuBLAS + fused cell kernels
    "onednn",  # torch CPU aten::mkldnn_rnn_layer
    "cpu-native",  # torch CPU per-step linear + pointwise ops
    "tf-generic",  # TensorFlow While loop of MatMul/Sigmoid/Tanh
    "jax-generic",  # XLA-compiled loop (lax.scan while loop, or unrolled) of dots + logistic/tanh, no cuDNN call
    "inductor",  # torch.compile's decomposition of the cell loop: matmuls + generated (triton/C++) kernels
    "ort-rnn",  # ONNX LSTM/GRU node run by ONNX Runtime's CPU kernel
    "ort-cuda-rnn",  # ONNX LSTM/GRU node run by ONNX Runtime's CUDA execution provider
    "ort-decomposed",  # ONNX graph without an LSTM/GRU node (the recurrence as Loop/Scan/MatMul nodes)
    "none",  # nothing recurrent ran (a bug in the path or the trace)
    "mixed",  # more than one family in one pass
)

#: the families a claim may name: observations such as "none" and "mixed" are no kernel
CLAIMABLE = KERNEL_FAMILIES[:-2]
