"""What the native codec tests share: floats compared bit for bit, and one op encoded and
decoded by the engine under flush-to-zero, checked against the model."""

from __future__ import annotations

import numpy as np

import optireduce.host.native as native
from optireduce.host.model import codec
from optireduce.params import NicParams

E = native._engine


def assert_same_floats(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(
        np.asarray(a, dtype=np.float32).view(np.uint32), np.asarray(b).view(np.uint32)
    )


def assert_codec_with_flush_to_zero(
    x: np.ndarray, have: np.ndarray, n: int, e: int, op_id: int, p: NicParams
) -> codec.Encoded:
    """The engine's encode of x and decode of the packets in `have`, with FTZ/DAZ on
    (torch.set_flush_denormal): the model's bits and counters. Returns the model's encode."""
    import torch  # a dependency of the test extras: missing means a broken install

    ref = codec.encode(x, e, op_id, p)
    z = np.where(np.repeat(have, p.p), ref.y, 0)
    ref_d = codec.decode(z, have, n, e, op_id, p)
    assert torch.set_flush_denormal(True), "this CPU cannot flush denormals"
    try:
        y, sat_q, sat_t, nonfinite = E.encode(x, e, op_id, p)
        out, sat_out, empty = E.decode(z.astype(np.int32), have, n, e, op_id, p)
    finally:
        torch.set_flush_denormal(False)
    np.testing.assert_array_equal(y, ref.y)
    assert (sat_q, sat_t, nonfinite) == (ref.sat_quantize, ref.sat_transform, ref.nonfinite)
    assert_same_floats(out, ref_d.x)
    assert (sat_out, empty) == (ref_d.sat_output, ref_d.empty_blocks)
    return ref
