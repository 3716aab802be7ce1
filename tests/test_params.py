import pytest

from optireduce.params import NicParams, ParamError


def test_defaults_and_derived_widths():
    p = NicParams()
    assert (p.p, p.b, p.c) == (256, 4096, 16384)
    assert p.log2_b == 12
    assert p.headroom_bits_eff == 9  # ceil(12/2) + 3
    assert p.w_in == 23 and p.w_fwd == 35 and p.w_inv == 44
    assert p.w_acc == 32 + 6  # 64 contributions of 32 bits
    assert p.q_max == 2**22 - 1 and p.wire_max == 2**31 - 1
    assert p.padded_len(1) == 4096 and p.padded_len(4097) == 8192
    assert p.packets_for(5000) == 32


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_max", 1),
        ("p", 0),
        ("p", 20000),
        ("b", 1000),  # not a power of two
        ("b", 128),  # smaller than p
        ("c", 5000),  # not a multiple of b
        ("lanes", 3),
        ("ops_in_flight", 0),
        ("ops_in_flight", 65),
        ("w_wire", 16),
        ("headroom_bits", 0),
        ("headroom_bits", 13),  # more than log2(b)
        ("seed", -1),
        ("seed", 1 << 32),
        ("estimator", "magic"),
        ("rht", 1),
        ("t_b_us", 0),
        ("t_b_us", 1 << 28),  # the wrapping tick clock needs phases under 2^29 us
        ("tick_bits", 9),
        ("tick_bits", 33),
        ("sdram_addr_bits", 7),
        ("sdram_addr_bits", 33),
        ("t_c_init_us", 10**9),
        ("alpha_q8", 0),
        ("alpha_q8", 300),
        ("last_percent", 0),
        ("tc_gain_shift", 9),
        ("udp_port", 70000),
        ("job_id", 1 << 16),
        ("n_max", 2.5),
    ],
)
def test_rejects_bad_values_naming_the_parameter(field, value):
    with pytest.raises(ParamError, match=rf"NicParams\.{field}="):
        NicParams(**{field: value})


def test_t_b_us_takes_every_value_the_register_holds():
    assert NicParams(t_b_us=(1 << 28) - 1, t_c_min_us=1).t_b_us == (1 << 28) - 1


def test_a_narrower_clock_bounds_t_b_and_the_warm_up():
    """tick_bits = 24: t_B below 2^20 us; the warm-up's t_B is the longest that allows
    (30 s at the default 32 bits)."""
    p = NicParams(tick_bits=24)
    assert p.t_b_bits == 20 and p.replace(t_b_us=(1 << 20) - 1).t_b_us == (1 << 20) - 1
    with pytest.raises(ParamError, match=r"NicParams\.t_b_us=1048576: .*tick_bits=24"):
        p.replace(t_b_us=1 << 20)
    assert p.warmup_t_b_us == (1 << 20) - 1
    assert NicParams().warmup_t_b_us == 30_000_000


def test_replace_validates_again():
    p = NicParams(p=16, b=64, c=256)
    assert p.replace(b=128).b == 128
    with pytest.raises(ParamError, match=r"NicParams\.b="):
        p.replace(b=8)
