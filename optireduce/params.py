"""NicParams: the one object that fixes every width, size, seed and timeout.

The gateware, the software model, the transport and the tests all read their
sizes from here; nothing else in the tree hard-codes a width.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ESTIMATORS = ("unbiased", "plain")
TC_SAMPLES = ("duration", "last_arrival")
# t_B of the DDP hook's warm-up phases: only a dead peer reaches it. A NIC starts with it
# (its t_C starts there too), and the hook sets the calibrated t_B after the warm-up.
WARMUP_T_B_US = 30_000_000


class ParamError(ValueError):
    """A NicParams field has a value the datapath cannot use."""


def _is_pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class NicParams:
    """Build-time and run-time parameters of one OptiReduce NIC.

    Sizes are in elements; times in microsecond ticks.
    """

    n_max: int = 64  # largest world size (contributor bitmap width)
    p: int = 256  # elements per packet (1 KiB payload: standard MTU)
    b: int = 4096  # Hadamard block (power of two, multiple of p)
    c: int = 16384  # chunk capacity: elements of one op (multiple of b)
    lanes: int = 1  # elements per cycle in the gateware
    ops_in_flight: int = 2  # K: ops the host keeps in flight (the NIC holds 2K)
    w_wire: int = 32  # bits of one payload element on the wire
    headroom_bits: int | None = None  # wire bits reserved for transform growth
    seed: int = 0x5EED_0001  # sign PRNG key (shared by the job)
    rht: bool = True  # randomized Hadamard transform on/off
    estimator: str = "unbiased"  # decode of missing reduced packets
    t_b_us: int = 20_000  # hard bound of one phase
    t_c_init_us: int | None = None  # t_C before any phase has completed (= t_b_us)
    t_c_min_us: int = 1  # floor of t_C (a host that may be descheduled wants more)
    alpha_q8: int = 64  # early-timeout idle gap = alpha * t_C, alpha in 1/256
    last_percent: int = 1  # share of each sender's packets flagged LAST
    tc_gain_shift: int = 3  # t_C mean EWMA gain 2^-shift
    tc_dev_shift: int = 2  # t_C deviation EWMA gain 2^-shift
    tc_dev_mult: int = 4  # t_C = mean + mult * deviation
    tc_sample: str = "duration"  # t_C sample of a deadline-ended phase (docs/deadlines.md)
    # A peer's frame of op j says it is done with op j - K even beyond the receive window,
    # and ops started later take it as gone (docs/deadlines.md). Off: the gateware's rule.
    progress_ahead: bool = False
    udp_port: int = 17017
    job_id: int = 1
    # Packets carry the sender's exponent proposal for op + K in the header's `reserved`
    # field, and start_op may leave the op's exponent to the NIC (docs/numerics.md 1).
    # Off: frames as the gateware builds and parses them today (reserved = 0).
    exp_inband: bool = False  # exponents agreed in-band from proposals carried ahead of time
    exp_lead: int | None = None  # in-band proposals are for op + lead (None: 2K)
    # Gateware only: a smaller NIC whose two directions share 1 element a cycle
    # (docs/gateware.md, "One FWHT"); no effect without rht (no transform, no FWHT)
    fwht_shared: bool = False  # one FWHT serves encode and decode, a block at a time
    # Gateware only: bits of the NIC's wrapping microsecond clock; t_b_us < 2^(tick_bits - 4)
    # (docs/deadlines.md, "The tick clock's width"). The model's ticks do not wrap.
    tick_bits: int = 32
    # Gateware only: the phase-1 accumulators in SDRAM behind a native port of this many
    # address bits (hw/sdram_aggregator.py; docs/boards.md); 0: in block RAM
    sdram_addr_bits: int = 0

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                value = getattr(self, name)
                raise ParamError(f"NicParams.{name}={value!r}: {msg}")

        for name in (
            "n_max", "p", "b", "c", "lanes", "ops_in_flight", "w_wire", "seed", "t_b_us",
            "t_c_min_us", "tick_bits", "sdram_addr_bits",
            "alpha_q8", "last_percent", "tc_gain_shift", "tc_dev_shift", "tc_dev_mult",
            "udp_port", "job_id",
        ):  # fmt: skip
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool), name, "must be an int")
        need(2 <= self.n_max <= 4096, "n_max", "world size max must be in 2..4096")
        need(1 <= self.p <= 16 * 1024, "p", "elements per packet must be in 1..16384")
        need(
            self.p * 4 + 32 + 28 <= 65535,
            "p",
            "packet does not fit one UDP datagram",
        )
        need(_is_pow2(self.b), "b", "transform block must be a power of two")
        need(self.b % self.p == 0, "b", f"must be a multiple of p={self.p}")
        need(self.b // self.p >= 1, "b", "must hold at least one packet")
        need(self.c >= self.b and self.c % self.b == 0, "c", f"must be a multiple of b={self.b}")
        need(self.c <= 1 << 30, "c", "chunk capacity must be at most 2^30 elements")
        need(_is_pow2(self.lanes) and self.lanes <= self.p, "lanes", "power of two, at most p")
        need(1 <= self.ops_in_flight <= 64, "ops_in_flight", "K must be in 1..64")
        need(self.w_wire == 32, "w_wire", "UBT v1 carries 32-bit elements")
        for name in ("headroom_bits", "t_c_init_us", "exp_lead"):
            v = getattr(self, name)
            need(v is None or (isinstance(v, int) and not isinstance(v, bool)), name,
                 "must be an int or None")  # fmt: skip
        need(self.b >= 2, "b", "transform block must be at least 2")
        need(
            1 <= self.headroom_bits_eff <= min(self.log2_b, 16),
            "headroom_bits",
            f"must be in 1..min(log2(b)={self.log2_b}, 16)",
        )
        need(0 <= self.seed < 1 << 32, "seed", "must fit 32 bits")
        need(self.estimator in ESTIMATORS, "estimator", f"must be one of {ESTIMATORS}")
        need(self.tc_sample in TC_SAMPLES, "tc_sample", f"must be one of {TC_SAMPLES}")
        need(isinstance(self.rht, bool), "rht", "must be a bool")
        need(isinstance(self.exp_inband, bool), "exp_inband", "must be a bool")
        need(isinstance(self.progress_ahead, bool), "progress_ahead", "must be a bool")
        need(isinstance(self.fwht_shared, bool), "fwht_shared", "must be a bool")
        need(
            self.ops_in_flight <= self.exp_lead_eff <= 256,
            "exp_lead",
            f"must be in K={self.ops_in_flight}..256 (an op is proposed for before it starts)",
        )
        need(10 <= self.tick_bits <= 32, "tick_bits", "must be in 10..32")
        need(
            self.sdram_addr_bits == 0 or 8 <= self.sdram_addr_bits <= 32, "sdram_addr_bits",
            "must be 0 (accumulators on chip) or the SDRAM port's 8..32 address bits",
        )  # fmt: skip
        need(
            1 <= self.t_b_us < 1 << self.t_b_bits, "t_b_us",
            f"must be in 1..2^{self.t_b_bits}-1 microseconds (tick_bits={self.tick_bits}: the "
            f"NIC's tick clock wraps every 2^{self.tick_bits} us, and a phase must last under "
            f"2^{self.tick_bits - 3} of them: docs/deadlines.md, \"The tick clock's width\")",
        )  # fmt: skip
        need(
            self.t_c_init_us is None or 1 <= self.t_c_init_us <= self.t_b_us,
            "t_c_init_us",
            "must be in 1..t_b_us",
        )
        need(1 <= self.t_c_min_us <= self.t_b_us, "t_c_min_us", "must be in 1..t_b_us")
        need(1 <= self.alpha_q8 <= 256, "alpha_q8", "alpha must be in (0, 1]: 1..256")
        need(1 <= self.last_percent <= 100, "last_percent", "must be in 1..100")
        need(0 <= self.tc_gain_shift <= 8, "tc_gain_shift", "must be in 0..8")
        need(0 <= self.tc_dev_shift <= 8, "tc_dev_shift", "must be in 0..8")
        need(0 <= self.tc_dev_mult <= 16, "tc_dev_mult", "must be in 0..16")
        need(1 <= self.udp_port <= 65535, "udp_port", "must be a UDP port 1..65535")
        need(0 <= self.job_id < 1 << 16, "job_id", "must fit 16 bits")

    def replace(self, **changes: object) -> NicParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # Derived widths: see docs/numerics.md.
    @property
    def t_b_bits(self) -> int:
        """Bits of t_B (the CSR register's width): t_b_us < 2^t_b_bits."""
        return self.tick_bits - 4

    @property
    def t_c_max_us(self) -> int:
        """The most a peer's t_C is recorded as: 2^t_b_bits - 1, above every t_B the
        clock allows, so T = min(median, t_B) is the same (docs/deadlines.md)."""
        return (1 << self.t_b_bits) - 1

    @property
    def warmup_t_b_us(self) -> int:
        """The warm-up's t_B: WARMUP_T_B_US, or the longest this NIC's clock allows."""
        return min(WARMUP_T_B_US, (1 << self.t_b_bits) - 1)

    @property
    def op_count_bits(self) -> int:
        """Bits of a per-op count of elements (the STATS saturation counts): 0..C."""
        return self.c.bit_length()

    @property
    def log2_b(self) -> int:
        return self.b.bit_length() - 1

    @property
    def headroom_bits_eff(self) -> int:
        if self.headroom_bits is not None:
            return self.headroom_bits
        return min(self.log2_b, (self.log2_b + 1) // 2 + 3)

    @property
    def w_in(self) -> int:
        """Bits of a quantized input element (sign included)."""
        return self.w_wire - self.headroom_bits_eff

    @property
    def w_fwd(self) -> int:
        """Bits inside the forward transform: one more per radix-2 stage."""
        return self.w_in + self.log2_b

    @property
    def w_acc(self) -> int:
        """Bits of an aggregation accumulator (n_max contributions of w_wire)."""
        return self.w_wire + (self.n_max - 1).bit_length()

    @property
    def w_inv(self) -> int:
        """Bits inside the inverse transform."""
        return self.w_wire + self.log2_b

    @property
    def q_max(self) -> int:
        """Largest quantized magnitude (symmetric range, so negation never wraps)."""
        return (1 << (self.w_in - 1)) - 1

    @property
    def wire_max(self) -> int:
        return (1 << (self.w_wire - 1)) - 1

    @property
    def rx_window(self) -> int:
        """Op contexts of a NIC: its own K in flight plus K for peers up to K ops ahead."""
        return 2 * self.ops_in_flight

    @property
    def exp_lead_eff(self) -> int:
        """In-band exponent lead: op j carries proposals for op j + lead. 2K by default: a
        peer's frames of op j may then arrive up to K ops after j completed here and
        still count (docs/numerics.md 1)."""
        return 2 * self.ops_in_flight if self.exp_lead is None else self.exp_lead

    @property
    def t_c_init(self) -> int:
        return self.t_b_us if self.t_c_init_us is None else self.t_c_init_us

    @property
    def packets_per_block(self) -> int:
        return self.b // self.p

    def padded_len(self, n: int) -> int:
        """Elements sent for an op of n elements: n rounded up to whole blocks."""
        return max(1, -(-n // self.b)) * self.b

    def packets_for(self, n: int) -> int:
        return self.padded_len(n) // self.p
