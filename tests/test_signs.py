import numpy as np

from optireduce.host.model.signs import apply_signs, round_keys, sign_bits, speck_encrypt


def test_speck32_64_published_vector():
    # Beaulieu et al., "The SIMON and SPECK Families of Lightweight Block Ciphers", App. C
    rk = round_keys((0x1918, 0x1110, 0x0908, 0x0100))
    x, y = speck_encrypt(np.array([0x6574]), np.array([0x694C]), rk)
    assert (int(x[0]), int(y[0])) == (0xA868, 0x42F2)


def test_signs_are_balanced_and_keyed():
    n = 1 << 18
    a = sign_bits(7, 0, 0, n)
    b = sign_bits(7, 1, 0, n)
    c = sign_bits(8, 0, 0, n)
    for s in (a, b, c):
        assert abs(s.mean() - 0.5) < 4 * 0.5 / np.sqrt(n)
    # different op or seed: independent streams (agreement ~ 1/2)
    for other in (b, c):
        assert abs((a == other).mean() - 0.5) < 4 * 0.5 / np.sqrt(n)
    # neighbours are uncorrelated
    assert abs((a[1:] == a[:-1]).mean() - 0.5) < 4 * 0.5 / np.sqrt(n)


def test_any_window_matches_the_whole_stream():
    whole = sign_bits(3, 9, 0, 5000)
    for start, n in [(0, 1), (31, 2), (33, 100), (4095, 905)]:
        np.testing.assert_array_equal(sign_bits(3, 9, start, n), whole[start : start + n])


def test_apply_signs_is_an_involution():
    v = np.arange(-500, 500, dtype=np.int64)
    s = apply_signs(v, 1, 2)
    assert not np.array_equal(s, v)
    np.testing.assert_array_equal(np.abs(s), np.abs(v))
    np.testing.assert_array_equal(apply_signs(s, 1, 2), v)
