"""Statistics of one op at one NIC, as the status registers will report them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# how a phase ended: every contribution in, early timeout, hard deadline
COMPLETE, EARLY, DEADLINE = "complete", "early", "deadline"


@dataclass
class OpStats:
    op_id: int
    rank: int
    world: int
    n: int  # elements of the op
    exponent: int
    start_us: int = 0
    end_us: int = 0
    phase1_reason: str = ""  # complete | early | deadline
    phase2_reason: str = ""
    phase1_timeout_us: int = 0  # T = min(median t_C, t_B) when the phase ended
    phase2_timeout_us: int = 0
    phase1_end_us: int = 0
    p1_expected: int = 0  # contributions from peers to our slots
    p1_received: int = 0
    p2_expected: int = 0  # reduced packets from other owners
    p2_received: int = 0
    contributor_hist: list[int] = field(default_factory=list)  # [0] = reduced packets missing
    sat_quantize: int = 0
    sat_transform: int = 0
    sat_output: int = 0
    nonfinite: int = 0  # non-finite elements of this rank's input
    # 1 when the op's result is NaN: a non-finite input here, or flagged by a peer's frame
    nonfinite_result: int = 0
    empty_blocks: int = 0
    late: int = 0
    duplicate: int = 0
    t_c_us: tuple[int, int] = (0, 0)  # this node's t_C per phase after the op
    # per sender rank: its contributions (phase 1) and reduced packets (phase 2) that never
    # arrived by the phase's end; empty when the NIC does not say (the gateware's stats)
    p1_missing_from: list[int] = field(default_factory=list)
    p2_missing_from: list[int] = field(default_factory=list)

    @property
    def elapsed_us(self) -> int:
        return self.end_us - self.start_us

    @property
    def lost_phase1(self) -> int:
        return self.p1_expected - self.p1_received

    @property
    def lost_phase2(self) -> int:
        return self.p2_expected - self.p2_received

    @property
    def saturations(self) -> int:
        return self.sat_quantize + self.sat_transform + self.sat_output

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            elapsed_us=self.elapsed_us,
            lost_phase1=self.lost_phase1,
            lost_phase2=self.lost_phase2,
        )
        return d
