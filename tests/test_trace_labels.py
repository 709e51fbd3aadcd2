"""Mismatch messages name which call of which module erred and list the ops that decide the family first: an
encoder's and a decoder's call of one module class read alike, and a packed call's first ops are bookkeeping."""

from __future__ import annotations

from pytest_lstmperf.numerics.checks import check_trace
from pytest_lstmperf.observation.torch_trace import KernelTrace, ops_that_matter

# a packed call as the observer records it: the packing's indexing first, the recurrence after it
PACKED_OPS = ("unbind", "_local_scalar_dense", "select", "zeros", "index_select", "slice", "cat", "view", "detach",
              "new_zeros", "unsafe_split", "narrow", "t", "addmm", "sigmoid_", "tanh_")  # fmt: skip


def test_the_recurrent_ops_come_first_in_the_order_they_ran() -> None:
    assert ops_that_matter(("zeros", "mkldnn_rnn_layer", "addmm", "select", "tanh")) == [
        "mkldnn_rnn_layer", "addmm", "tanh", "zeros", "select",
    ]  # fmt: skip


def test_a_packed_calls_mismatch_shows_its_matmuls_and_gates_and_names_the_call() -> None:
    encoder = KernelTrace("cpu-native", "fp32", ops=PACKED_OPS, detail="LSTM(3, 4)",
                          call="Seq2Seq.encoder call 1, packed B3 T<=5")  # fmt: skip
    decoder = KernelTrace("cpu-native", "fp32", ops=PACKED_OPS, detail="LSTM(3, 4)",
                          call="Seq2Seq.decoder call 2, T1 B3")  # fmt: skip
    (mismatch,) = check_trace(("onednn", "fp32"), encoder, f"forward {encoder.label}")
    ops = mismatch.message.split("ops seen: ")[1]
    assert ops.startswith("addmm, sigmoid_, tanh_, ")  # before the bookkeeping, within the 12 shown
    assert "forward Seq2Seq.encoder call 1, packed B3 T<=5: LSTM(3, 4)" in mismatch.message
    assert encoder.describe() != decoder.describe()  # one module class, two calls: told apart
    assert "[Seq2Seq.decoder call 2, T1 B3: LSTM(3, 4)]" in decoder.describe()
    assert "addmm" in decoder.describe()  # shown within the first eight
