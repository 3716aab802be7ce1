"""Block RAM arithmetic of a board build: DP16KD (18 Kbit) blocks per memory, from NicParams.

Each memory of the datapath is listed with the depth and width its block declares
(hw/aggregator.py, hw/gather_buffer.py, hw/fwht.py, hw/packetizer.py, hw/parser.py,
hw/rgmii_mac.py, hw/host_adapter.py). A memory costs what yosys' ECP5 mapping pays for
it: the cheapest DP16KD aspect ratio (16K x 1 ... 512 x 36), tiled in depth and width.
Memories shallower than LUTRAM_DEPTH go to distributed RAM or flip-flops instead. The
sum is checked against the synthesized design in tests/test_bitstream.py, and
docs/boards.md explains the result per board.
"""

from __future__ import annotations

from optireduce import host_port
from optireduce.params import NicParams

DP16KD_BITS = 18 * 1024
MODES = ((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36))  # depth, width
LUTRAM_DEPTH = 64  # shallower memories are not mapped to block RAM (hw/fwht.py: d = 32)
DEVICE_DP16KD = {"LFE5U-25F": 56, "LFE5UM5G-45F": 108, "LFE5UM5G-85F": 208}
MAC_DP16KD = 2  # RgmiiMac(fifo_bytes=2048): RX frame FIFO + TX FIFO (docs/rgmii.md)
PACKET_BUFFERS_DP16KD = 4  # parser (2) and packetizer ping-pong (2) at P = 256, lanes = 1


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def dp16kd(depth: int, width: int) -> int:
    """DP16KD blocks for one depth x width memory (0 if it goes to LUTRAM)."""
    if depth < LUTRAM_DEPTH:
        return 0
    return min(-(-width // w) * -(-depth // d) for d, w in MODES)


def memories(p: NicParams, *, host_rx_words: int = 512) -> dict[str, tuple[int, int]]:
    """Every block-RAM-sized memory of a board build: name -> (depth, width)."""
    n_ctx = 1 << _bits(p.rx_window)
    rows = -(-(p.c // p.p) // 2)  # world >= 2: an owner holds at most half the packets
    beats = p.p // p.lanes
    mem = {
        "aggregator accumulators": (n_ctx * (1 << _bits(rows)) * (1 << _bits(beats)),
                                    p.lanes * p.w_acc),
        "aggregator bitmaps": (n_ctx * (1 << _bits(rows)), p.n_max + p.n_max.bit_length()),
        "gather buffer": (n_ctx * p.c // p.lanes, p.lanes * p.w_wire),  # n_ctx slots
        "host adapter frame buffer": (host_rx_words, 32),
        "host adapter result ring": (host_port.result_ring_words(p.n_max), 32),
    }  # fmt: skip
    for name, w_in in (("encoder FWHT", p.w_in), ("decoder FWHT", p.w_wire)):
        d, k = p.b // 2, 0
        while d >= 1:
            mem[f"{name} stage {k}"] = (d, p.lanes * (w_in + k + 1))
            d, k = d // 2, k + 1
    return mem


def bram_budget(p: NicParams, *, macs: int = 2, host_rx_words: int = 512) -> dict[str, int]:
    """DP16KD per memory (those that need any), plus MACs, packet buffers and "total"."""
    out = {
        name: dp16kd(d, w)
        for name, (d, w) in memories(p, host_rx_words=host_rx_words).items()
        if dp16kd(d, w)
    }
    out["RGMII MACs"] = macs * MAC_DP16KD
    out["parser + packetizer buffers"] = PACKET_BUFFERS_DP16KD
    out["total"] = sum(out.values())
    return out


def largest_c(p: NicParams, device: str, *, macs: int = 2) -> int:
    """The largest C (a multiple of p.b, at most 2^20) whose budget fits the device."""
    best = 0
    c = p.b
    while c <= 1 << 20:
        if bram_budget(p.replace(c=c), macs=macs)["total"] > DEVICE_DP16KD[device]:
            break
        best, c = c, c * 2
    return best
