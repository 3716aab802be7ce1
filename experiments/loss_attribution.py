"""Who made each missing packet late: the injected delay (by design) or our own processing.

Input, per rank: its ops' statistics (OpStats fields as arrays) and the native engine's
datagram trace (`NativeNic.take_trace`): every send with its injected delay, every arrival
with its tick, on one CLOCK_MONOTONIC (the ranks share a host).

A straggling rank starts its step late (it sleeps first): nobody waits for it, so it stays
behind by design for the next ops too, until it catches up (a rank behind finds its peers'
packets already in and skips the deadline waits they sit through) or a blocking exchange
lines the ranks up again. Our processing moves the ranks' starts too. `processing_clock`
separates the two from measured times: between two op starts a rank waits out its op's
deadlines (the protocol), sleeps (the injection) and processes (everything else).

A packet is missing at receiver r when the engine accepted none of its copies (the trace
has every arrival with the engine's verdict). It is charged:
- to the **design** when, sent at the protocol's time less our share of the two ranks'
  skew (or earlier, when it actually was), its injected delay alone still makes it arrive
  at or after the phase's end; or when it arrived before the end but beyond the
  receiver's window (a future op) because the receiver was behind by design. Of these,
  **straggler** when the sender (or, for the window, the receiver) was behind by design or
  its link late (extra delay), **delay** otherwise (the per-packet tail; a datagram the
  impairment dropped counts here too);
- to **processing** otherwise: with no processing it would have been in time; it was late
  because a rank computed or ran the hook longer than the other, the sender's engine sent or
  released it late, or the receiver read it late.

Anchors: phase 1 at the op's start; phase 2 at max(phase-1 end, start + T1) (docs/deadlines.md).
A phase's end is `phase1_end_us` / `end_us`. A missing packet whose send is not in the trace,
or whose sender's missing count the trace does not reproduce, is `unattributed`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

# index of each field in a trace row (host/native/nic.py TRACE_FIELDS)
OP, PHASE, PEER, PKT, TICK, DELAY, EXTRA = range(7)
VERDICT = DELAY  # of an arrival: the engine's drop reason (ubt.DROP_REASONS index), or:
ACCEPTED, NEVER = -1, -2
CAUSES = ("straggler", "delay", "processing", "unattributed")


def _arrivals(arrived: np.ndarray, origin: int) -> dict[tuple[int, int, int, int], tuple]:
    """(op, phase, sender, pkt) -> (first arrival absolute us, its verdict, accepted by the
    engine at some arrival)."""
    out: dict[tuple[int, int, int, int], tuple] = {}
    for row in arrived:
        key = (int(row[OP]), int(row[PHASE]), int(row[PEER]), int(row[PKT]))
        t, verdict = int(row[TICK]) + origin, int(row[VERDICT])
        had = out.get(key)
        if had is None:
            out[key] = (t, verdict, verdict == ACCEPTED)
        else:
            first = had[:2] if had[0] <= t else (t, verdict)
            out[key] = (*first, had[2] or verdict == ACCEPTED)
    return out


def _sends(rank: int, sent: np.ndarray, origin: int) -> dict[tuple, tuple[int, int, int]]:
    """(op, phase, sender, dst, pkt) -> (send time absolute us, delay us, extra us)."""
    out: dict[tuple, tuple[int, int, int]] = {}
    for row in sent:
        key = (int(row[OP]), int(row[PHASE]), rank, int(row[PEER]), int(row[PKT]))
        out.setdefault(key, (int(row[TICK]) + origin, int(row[DELAY]), int(row[EXTRA])))
    return out


def replay_missing(
    ranks: list[dict],
    world: int,
    sends: dict,
    sleep_us: np.ndarray,
    synced: np.ndarray,
    rx_window: int,
    extra: bool,
) -> set[tuple[int, int, int, int, int]]:
    """The packets a world without processing would miss: (phase, receiver, op index,
    sender, pkt).

    Ops run one after the other (one op a step, as the digits model's). Every rank starts
    op k when it ends op k-1 plus its sleep (after a blocking exchange,
    `synced[k]`, when the last rank ends op k-1); sends at the start (phase 1) or at its
    phase-1 end (phase 2); each datagram arrives after its injected delay from the trace
    (less the late link's extra delay unless `extra`). A receiver keeps a frame that arrives
    before its phase ends and once it has completed op k - rx_window (else: a future op); a
    phase ends complete at its last arrival, else at its deadline, with the T that was in
    force at that rank (the ops' statistics). The early-idle rule and the peers-gone rule,
    which only end phases sooner, are left out."""
    n_ops = len(ranks[0]["op_id"])
    begin = np.zeros((world, n_ops), dtype=np.int64)
    p1_end = np.zeros((world, n_ops), dtype=np.int64)
    end = np.zeros((world, n_ops), dtype=np.int64)
    missing: set[tuple[int, int, int, int, int]] = set()
    never = 1 << 62

    def arrival(op: int, phase: int, s: int, r: int, i: int, sent: int) -> int:
        snd = sends.get((op, phase, s, r, i))
        if snd is None or snd[1] < 0:
            return never
        return sent + snd[1] - (0 if extra else snd[2])

    for k in range(n_ops):
        op = int(ranks[0]["op_id"][k])
        n_pk = int(ranks[0]["n_packets"][k])
        prev = end[:, k - 1] if k else np.zeros(world, dtype=np.int64)
        begin[:, k] = (prev.max() if k == 0 or synced[k] else prev) + sleep_us[:, k]
        for phase in (1, 2):
            for r in range(world):
                t_p = int(ranks[r][f"phase{phase}_timeout_us"][k])
                if phase == 1:
                    anchor = int(begin[r, k])
                else:
                    anchor = max(int(p1_end[r, k]), int(begin[r, k]) + int(
                        ranks[r]["phase1_timeout_us"][k]))  # fmt: skip
                deadline = anchor + t_p
                opened = int(end[r, k - rx_window]) if k >= rx_window else -never
                got: list[tuple[int, int, int]] = []
                for s in range(world):
                    if s == r:
                        continue
                    sent = int(begin[s, k] if phase == 1 else p1_end[s, k])
                    for i in range(r if phase == 1 else s, n_pk, world):
                        got.append((arrival(op, phase, s, r, i, sent), s, i))
                kept = [g for g in got if opened <= g[0] < deadline]
                if len(kept) == len(got):
                    done = max([anchor if phase == 1 else int(p1_end[r, k])]
                               + [g[0] for g in got])  # fmt: skip
                else:
                    done = deadline
                    missing.update((phase, r, k, g[1], g[2]) for g in got if g not in kept)
                if phase == 1:
                    p1_end[r, k] = max(done, int(begin[r, k]))
                else:
                    end[r, k] = done
    return missing


def attribute(
    ranks: list[dict],
    world: int,
    sleep_us: np.ndarray | None = None,
    synced: np.ndarray | None = None,
    rx_window: int = 4,
) -> dict:
    """Every missing packet of every op, phase and rank, with its cause.

    ranks[r]: arrays `op_id`, `start_us`, `phase1_end_us`, `end_us`, `phase1_timeout_us`,
    `phase2_timeout_us`, `n_packets`, `p1_missing_from`, `p2_missing_from` (one row per op),
    `trace_sent`, `trace_arrived`, `trace_origin_us`. sleep_us[r, k]: how long rank r slept
    before op k (None: nobody); synced[k]: a blocking exchange lined the ranks up before op
    k (None: only before the first); rx_window: NicParams.rx_window.

    The packets the engines missed (none of their copies accepted) are charged to the
    design when a world without processing misses them too (`replay_missing`): to the
    **delay** when that world misses them even without sleeps and extra link delays, to the
    **straggler** otherwise; the rest to **processing**. A sender whose missing count the
    trace does not reproduce (a held packet its op discarded at start for another exponent)
    or whose send is not in the trace has its packets `unattributed`.

    Returns {"missing": int64 [n, 11] rows (phase, receiver, op index, sender, pkt, cause
    index in CAUSES, lateness us of the first arrival past the phase's end or -1 if none
    came, injected delay us, skew us: send time - receiver's anchor, window us: end -
    anchor, verdict of the first arrival or NEVER), "causes": CAUSES}.
    """
    n_ops = len(ranks[0]["op_id"])
    sleep_us = np.zeros((world, n_ops), dtype=np.int64) if sleep_us is None else sleep_us
    synced = np.zeros(n_ops, dtype=bool) if synced is None else synced
    sends: dict[tuple, tuple[int, int, int]] = {}
    for r, d in enumerate(ranks):
        sends.update(_sends(r, d["trace_sent"], int(d["trace_origin_us"])))
    design = replay_missing(ranks, world, sends, sleep_us, synced, rx_window, True)
    no_sleep = np.zeros_like(sleep_us)
    delay_alone = replay_missing(ranks, world, sends, no_sleep, synced, rx_window, False)
    rows: list[tuple] = []
    for r, d in enumerate(ranks):
        origin = int(d["trace_origin_us"])
        arrivals = _arrivals(d["trace_arrived"], origin)
        for k, op in enumerate(d["op_id"]):
            op = int(op)
            n_pk = int(d["n_packets"][k])
            start = origin + int(d["start_us"][k])
            p1_end = origin + int(d["phase1_end_us"][k])
            anchor2 = max(p1_end, start + int(d["phase1_timeout_us"][k]))
            for phase, anchor, end, miss in (
                (1, start, p1_end, d["p1_missing_from"][k]),
                (2, anchor2, origin + int(d["end_us"][k]), d["p2_missing_from"][k]),
            ):
                for s in range(world):
                    if int(miss[s]) <= 0:
                        continue
                    # phase 1: the sender's contributions to our slots; phase 2: its slots
                    owner = r if phase == 1 else s
                    lost = [i for i in range(owner, n_pk, world)
                            if not arrivals.get((op, phase, s, i), (0, 0, False))[2]]  # fmt: skip
                    exact = len(lost) == int(miss[s])
                    for i in lost:
                        arr, verdict, _ = arrivals.get((op, phase, s, i), (None, NEVER, False))
                        late = -1 if arr is None else arr - end
                        snd = sends.get((op, phase, s, r, i))
                        t_send, delay, _ = snd if snd is not None else (anchor, 0, 0)
                        key = (phase, r, k, s, i)
                        if not exact or snd is None:
                            cause = 3
                        elif key not in design:
                            cause = 2
                        else:
                            cause = 1 if key in delay_alone else 0
                        rows.append((phase, r, k, s, i, cause, late, delay, t_send - anchor,
                                     end - anchor, verdict))  # fmt: skip
    return {"missing": np.array(rows, dtype=np.int64).reshape(len(rows), 11), "causes": CAUSES}


def split_by_step(
    ranks: list[dict],
    world: int,
    steps: int,
    sleep_us: np.ndarray | None = None,
    synced: np.ndarray | None = None,
    rx_window: int = 4,
) -> dict:
    """Entries lost (phase 2) and contributions lost (phase 1) per cause: overall and per
    training step, as fractions of the reduced packets (`n_packets`, the denominator of
    entries_lost) and of the contributions expected (`p1_expected`)."""
    got = attribute(ranks, world, sleep_us, synced, rx_window)
    miss = got["missing"]
    step_of = [np.asarray(d["op_step"]) for d in ranks]
    packets = np.zeros(steps)
    contrib = np.zeros(steps)
    for r, d in enumerate(ranks):
        np.add.at(packets, step_of[r], d["n_packets"])
        np.add.at(contrib, step_of[r], d["p1_expected"])
    per = {(ph, c): np.zeros(steps) for ph in (1, 2) for c in range(len(CAUSES))}
    for row in miss:
        per[(int(row[0]), int(row[5]))][step_of[int(row[1])][int(row[2])]] += 1
    out: dict = {}
    for ph, denom, name in ((2, packets, "entries_lost"), (1, contrib, "contributions_lost")):
        for c, cause in enumerate(CAUSES):
            v = per[(ph, c)]
            frac = np.divide(v, denom, out=np.zeros(steps), where=denom > 0)
            out[f"{name}_{cause}"] = float(v.sum()) / max(1.0, float(denom.sum()))
            if ph == 2 and cause != "unattributed":
                out[f"step_{name}_{cause}"] = frac.tolist()
        if ph == 2:
            proc = per[(2, 2)]
            frac = np.divide(proc, denom, out=np.zeros(steps), where=denom > 0)
            out["entries_lost_processing_max_step"] = float(frac.max(initial=0.0))
            out["entries_lost_processing_worst_step"] = int(frac.argmax()) if steps else -1
    out["loss_causes"] = _evidence(miss)
    return out


def _evidence(miss: np.ndarray) -> dict:
    """For each phase and cause: how many, the medians and P90s that say why (how late the
    first copy arrived past the end, -1 none; its injected delay; the send's skew from the
    receiver's anchor; the window end - anchor) and the engine's verdicts on the first copies
    (`never`: none arrived)."""
    from optireduce.ubt import DROP_REASONS

    out: dict = defaultdict(dict)
    for ph in (1, 2):
        for c, cause in enumerate(CAUSES):
            sel = miss[(miss[:, 0] == ph) & (miss[:, 5] == c)]
            if not len(sel):
                continue
            e: dict = {"count": len(sel)}
            for j, name in ((6, "late_us"), (7, "delay_us"), (8, "skew_us"), (9, "window_us")):
                col = sel[:, j]
                e[f"{name}_p50"] = float(np.percentile(col, 50))
                e[f"{name}_p90"] = float(np.percentile(col, 90))
            v, n = np.unique(sel[:, 10], return_counts=True)
            e["verdicts"] = {
                "never" if x == NEVER else DROP_REASONS[x]: int(m)
                for x, m in zip(v, n, strict=True)
            }
            out[f"phase{ph}"][cause] = e
    return dict(out)
