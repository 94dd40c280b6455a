#!/usr/bin/python3
"""An independent NF4 quantiser, for tests/ops/nf4_test.cc.

    /usr/bin/python3 tests/ops/nf4_reference.py DIR

Written from QLoRA's description (Dettmers et al., 2023, "QLoRA: Efficient
Finetuning of Quantized LLMs", section 3, and the 8-bit dynamic map of
Dettmers et al., 2022, "8-bit Optimizers via Block-wise Quantization"), in
numpy, with the rounding choices Nekton's ops.h states:

  - weights are flattened and cut into blocks of 64 (the last may be short);
    each value is w / absmax (f32), absmax = max |w| over its block, coded as
    the index of the nearest of the 16 NF4 levels (the lower on an exact tie;
    an all-zero block codes level 0.0); two codes a byte, the first in the
    high nibble, the pad nibble of an odd count 0;
  - double quantisation: offset = the mean of all absmaxes (summed in order in
    double, rounded to f32 once); a = absmax - offset (f32); in blocks of 256,
    scale = max |a| (f32) and each a / scale (f32) coded as the index of the
    nearest of the 256 signed dynamic levels (lower on a tie; scale 0 codes
    level 0.0);
  - a value reads back as level[code] * (dyn[acode] * scale + offset), each
    operation rounded to f32.

Nearest levels are found by distances in float64 (argmin, whose first minimum
is the lower index): a normalised value and a level are f32 numbers within a
few binades of each other wherever the choice is close, so the distances are
exact there.

For every DIR/NAME.f32 (raw little-endian f32 weights, flattened) it writes
NAME.codes (u8), NAME.acodes (u8), NAME.scale (f32), NAME.offset (f32, one
value) and NAME.deq (f32, the values read back); and DIR/dynamic.f32, the 256
dynamic levels.
"""
import glob
import os
import sys

import numpy as np

BLOCK = 64
SCALE_BLOCK = 256

# The NF4 levels of the QLoRA paper (appendix E), the quantiles of N(0, 1)
# normalised to [-1, 1], with an exact zero.
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=np.float32)


def dynamic_map():
    """The signed 8-bit dynamic map: for exponent i = 0..6, the 2^i midpoints of
    linspace(0.1, 1, 2^i + 1) times +-10^(i - 6); then 0 and 1. In float64,
    rounded to f32, sorted."""
    vals = []
    for i in range(7):
        edges = np.linspace(0.1, 1.0, 2**i + 1)
        means = (edges[:-1] + edges[1:]) / 2.0
        unit = 10.0**(i - 6)
        vals += list(unit * means)
        vals += list(-(unit * means))
    vals += [0.0, 1.0]
    assert len(vals) == 256, len(vals)
    out = np.sort(np.array(vals, dtype=np.float64).astype(np.float32))
    assert np.all(np.diff(out) > 0)
    return out


def nearest(x, levels):
    """Index of the nearest level to each f32 x (the lower on a tie)."""
    d = np.abs(x.astype(np.float64)[:, None] - levels.astype(np.float64)[None, :])
    return np.argmin(d, axis=1).astype(np.uint8)


def quantize(w, dyn):
    n = w.size
    nb = -(-n // BLOCK)
    padded = np.zeros(nb * BLOCK, dtype=np.float32)
    padded[:n] = w
    blocks = padded.reshape(nb, BLOCK)
    absmax = np.abs(blocks).max(axis=1)  # zero padding never raises it
    safe = np.where(absmax > 0, absmax, np.float32(1)).astype(np.float32)
    normed = (blocks / safe[:, None]).astype(np.float32)
    codes = nearest(normed.reshape(-1), NF4).reshape(nb, BLOCK)
    codes[absmax == 0, :] = 7
    flat = codes.reshape(-1)[:n]
    if n % 2:
        flat = np.concatenate([flat, np.zeros(1, dtype=np.uint8)])
    packed = ((flat[0::2] << 4) | flat[1::2]).astype(np.uint8)

    total = 0.0
    for a in absmax.tolist():  # in order, in double
        total += a
    offset = np.float32(total / nb)
    centred = (absmax - offset).astype(np.float32)
    ns = -(-nb // SCALE_BLOCK)
    zero = int(np.nonzero(dyn == 0)[0][0])
    acodes = np.empty(nb, dtype=np.uint8)
    scales = np.empty(ns, dtype=np.float32)
    for s in range(ns):
        a = centred[s * SCALE_BLOCK:(s + 1) * SCALE_BLOCK]
        m = np.float32(np.abs(a).max())
        scales[s] = m
        if m == 0:
            acodes[s * SCALE_BLOCK:(s + 1) * SCALE_BLOCK] = zero
        else:
            acodes[s * SCALE_BLOCK:(s + 1) * SCALE_BLOCK] = nearest((a / m).astype(np.float32), dyn)

    # Read back, each operation in f32.
    block_scale = scales[np.arange(nb) // SCALE_BLOCK]
    amax_dq = (dyn[acodes] * block_scale).astype(np.float32) + offset
    values = (NF4[codes] * amax_dq.astype(np.float32)[:, None]).astype(np.float32)
    return packed, acodes, scales, np.array([offset], dtype=np.float32), values.reshape(-1)[:n]


def main():
    folder = sys.argv[1]
    dyn = dynamic_map()
    dyn.astype('<f4').tofile(os.path.join(folder, 'dynamic.f32'))
    inputs = sorted(glob.glob(os.path.join(folder, '*.f32')))
    inputs = [p for p in inputs if os.path.basename(p) != 'dynamic.f32']
    for path in inputs:
        w = np.fromfile(path, dtype='<f4')
        stem = path[:-len('.f32')]
        with np.errstate(over='raise', invalid='raise', divide='raise', under='ignore'):
            packed, acodes, scales, offset, values = quantize(w, dyn)
        packed.tofile(stem + '.codes')
        acodes.tofile(stem + '.acodes')
        scales.astype('<f4').tofile(stem + '.scale')
        offset.astype('<f4').tofile(stem + '.offset')
        values.astype('<f4').tofile(stem + '.deq')
        print(f'{os.path.basename(stem)}: {w.size} values, {acodes.size} blocks, offset {offset[0]!r}')


if __name__ == '__main__':
    main()
