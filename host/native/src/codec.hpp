// The codec of one op in C++: the native twin of host/model/{quantize,signs,fwht,codec}.py.
//
// Every function computes exactly the bits of the Python model (docs/numerics.md states the
// arithmetic; tests/native compares the two bit for bit). Plain pointers and counts, no Python:
// the engine (engine*.cpp) calls these from its threads, module.cpp binds them for tests.
// Bad arguments throw std::invalid_argument (nanobind turns it into ValueError). Nothing here
// allocates on the per-op path after a thread's first call (one B-element scratch per thread).
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce {

enum class Estimator : uint8_t { unbiased = 0, plain = 1 };
// t_C sample of a deadline-ended phase (NicParams.tc_sample).
enum class TcSample : uint8_t { duration = 0, last_arrival = 1 };

// NicParams (optireduce/params.py) as a plain struct, shared by the codec and the engine.
// Defaults equal NicParams'. headroom_bits and t_c_init_us hold the *effective* values
// (NicParams.headroom_bits_eff, NicParams.t_c_init): params_from_py fills them that way.
struct Params {
    int32_t n_max = 64;
    int32_t p = 256;
    int32_t b = 4096;
    int64_t c = 16384;
    int32_t lanes = 1;
    int32_t ops_in_flight = 2;
    int32_t w_wire = 32;
    int32_t headroom_bits = 9;
    uint32_t seed = 0x5EED0001u;
    bool rht = true;
    Estimator estimator = Estimator::unbiased;
    int64_t t_b_us = 20000;
    int64_t t_c_init_us = 20000;
    int64_t t_c_min_us = 1;
    int64_t t_c_max_us = (int64_t{1} << 28) - 1;  // NicParams.t_c_max_us: a peer's t_C at most
    int32_t alpha_q8 = 64;
    int32_t last_percent = 1;
    int32_t tc_gain_shift = 3;
    int32_t tc_dev_shift = 2;
    int32_t tc_dev_mult = 4;
    TcSample tc_sample = TcSample::duration;
    bool progress_ahead = false;  // NicParams.progress_ahead: peer progress beyond the window
    int32_t udp_port = 17017;
    int32_t job_id = 1;

    // Derived widths, as NicParams derives them.
    int log2_b() const;
    int w_in() const { return w_wire - headroom_bits; }
    int64_t q_max() const { return (int64_t{1} << (w_in() - 1)) - 1; }
    int64_t wire_max() const { return (int64_t{1} << (w_wire - 1)) - 1; }
    int32_t packets_per_block() const { return b / p; }
    // Elements sent for an op of n elements: n rounded up to whole blocks (at least one).
    size_t padded_len(size_t n) const;
    size_t packets_for(size_t n) const { return padded_len(n) / static_cast<size_t>(p); }
    // Throws std::invalid_argument unless the codec's fields are usable (b a power of two
    // in 2..MAX_BLOCK, p divides b, w_wire == 32, headroom in 1..min(log2 b, 16)).
    void check() const;
};

constexpr int EXP_MIN = -128;  // the exponent travels as an int8
constexpr int EXP_MAX = 127;
constexpr uint32_t FLT_MAX_BITS = 0x7F7FFFFFu;  // largest finite float32 bit pattern
constexpr int MAX_BLOCK = 65536;               // largest transform block (fwht.MAX_BLOCK)
constexpr int SPECK_ROUNDS = 22;

// ------------------------------------------------------------------ float32 <-> fixed

// quantize.propose_exponent: smallest-step exponent for which every finite x[i] quantizes
// without saturating, clamped to int8; 0 when no value is finite and non-zero.
int propose_exponent(const float* x, size_t n, const Params& p);

// quantize.agree_exponent: the op's exponent is the largest proposal.
inline int agree_exponent(const int* proposals, size_t n) {
    int e = EXP_MIN;
    for (size_t i = 0; i < n; ++i) e = proposals[i] > e ? proposals[i] : e;
    return e;
}

struct QuantizeCounts {
    int64_t saturated = 0;  // clamped to +-q_max (inf included)
    int64_t nonfinite = 0;  // NaN (-> 0) and inf (-> +-q_max)
};

// quantize.quantize: q[i] = sign(x) floor(|x| 2^-E + 1/2), clamped to +-q_max (< 2^31).
QuantizeCounts quantize(const float* x, size_t n, int exponent, int64_t q_max, int32_t* q);
QuantizeCounts quantize(const float* x, size_t n, int exponent, int64_t q_max, int64_t* q);

// quantize.dequantize: out[i] = float32 nearest v[i] * 2^E (ties to even, subnormals exact),
// magnitudes above FLT_MAX clamped to +-FLT_MAX. Returns the count clamped.
// Throws std::invalid_argument if some |v[i]| >= 2^53 (out is then unspecified).
int64_t dequantize(const int64_t* v, size_t n, int exponent, float* out);

// ------------------------------------------------------------------ random signs

// Speck32/64 round keys of one op: key = (op_id[31:16], op_id[15:0], seed[31:16], seed[15:0]).
struct SignKey {
    uint16_t rk[SPECK_ROUNDS];
};
SignKey sign_key(uint32_t seed, uint32_t op_id);
// Speck32/64 key schedule from (l2, l1, l0, k0) as the designers print the key.
SignKey speck_key_schedule(uint16_t l2, uint16_t l1, uint16_t l0, uint16_t k0);
// One block: (x, y) -> (x', y'), x the high word.
void speck_encrypt(const SignKey& k, uint16_t& x, uint16_t& y);
// The 32 signs of counter ctr (elements 32 ctr .. 32 ctr + 31; bit i mod 32 is element i).
uint32_t sign_word(const SignKey& k, uint32_t ctr);
// signs.sign_bits: out[j] = 1 where element start + j is negated, else 0.
void sign_bits(const SignKey& k, uint64_t start, size_t n, uint8_t* out);
// signs.apply_signs for elements start .. start + n - 1: out[j] = -v[j] where the sign bit of
// element start + j is 1 (in place allowed: out == v). Its own inverse.
void apply_signs(const SignKey& k, uint64_t start, const int64_t* v, size_t n, int64_t* out);
void apply_signs(const SignKey& k, uint64_t start, const int32_t* v, size_t n, int32_t* out);

// ------------------------------------------------------------------ Walsh-Hadamard transform

// fwht.fwht_blocks: y = H_b x for each block of b elements (natural/Sylvester order,
// unnormalised), exact in int64 while |x| b < 2^63. n a multiple of b; b a power of two in
// 1..MAX_BLOCK; x == y (in place) allowed for the int64 form. Throws on a bad b or n.
void fwht_blocks(const int32_t* x, size_t n, int b, int64_t* y);
void fwht_blocks(const int64_t* x, size_t n, int b, int64_t* y);

// The encoder's forward transform with codec.saturate: y = clamp(H_b x, +-limit) per block,
// exact before the clamp (int64 inside). x == y allowed. Returns the count clamped.
int64_t fwht_saturate(const int32_t* x, size_t n, int b, int64_t limit, int32_t* y);

// codec.div_round: t / d rounded half away from zero, exactly (d > 0, |t| < 2^61).
inline int64_t div_round(int64_t t, int64_t d) {
    const int64_t mag = (2 * (t < 0 ? -t : t) + d) / (2 * d);
    return t < 0 ? -mag : mag;
}

// div_round of n values by one divisor, vectorised (no integer division while |t| < 2^51):
// the aggregator's mean of a slot's contributions. d >= 1 and |t| < 2^61 or it throws; the
// int32 form needs every quotient to fit (a mean of wire values always does).
void div_round_n(const int64_t* t, size_t n, int64_t d, int64_t* out);
void div_round_n(const int64_t* t, size_t n, int64_t d, int32_t* out);

// ------------------------------------------------------------------ encode / decode

struct EncodeCounts {
    int64_t sat_quantize = 0;
    int64_t sat_transform = 0;
    int64_t nonfinite = 0;
};

// codec.encode: quantize with the op's exponent, zero-pad to p.padded_len(n), random signs
// (if p.rht), blockwise FWHT, saturate to +-wire_max. y holds p.padded_len(n) elements (the
// wire width: int32). x and y must not overlap.
EncodeCounts encode(const float* x, size_t n, int exponent, uint32_t op_id, const Params& p,
                    int32_t* y);
// The same for blocks [block_begin, block_end) only (y points at the op's start, like x):
// the engine encodes block by block as it packetises. encode() == all blocks in turn.
EncodeCounts encode_blocks(const float* x, size_t n, int exponent, uint32_t op_id,
                           const Params& p, size_t block_begin, size_t block_end, int32_t* y);
// Block `block` only, into y[0 .. p.b) (x at the op's start): a sender that encodes a block
// and packetises it at once keeps one block of scratch, in L2, instead of the whole op.
EncodeCounts encode_block(const float* x, size_t n, int exponent, uint32_t op_id,
                          const Params& p, size_t block, int32_t* y);

struct DecodeCounts {
    int64_t sat_output = 0;    // outputs clamped to +-FLT_MAX
    int64_t empty_blocks = 0;  // blocks with no reduced packet (decoded as zeros)
};

// codec.decode: z = reduced values (p.padded_len(n) elements, missing packets already zero),
// have[k] != 0 where reduced packet k arrived (p.packets_for(n) flags). With p.rht: blockwise
// FWHT, divide by B (plain) or by the block's received elements (unbiased), undo the signs;
// then fixed -> float32 into out[0..n). z is not modified.
DecodeCounts decode(const int32_t* z, const uint8_t* have, size_t n, int exponent,
                    uint32_t op_id, const Params& p, float* out);
// The same for blocks [block_begin, block_end) only (z, have and out point at the op's start).
DecodeCounts decode_blocks(const int32_t* z, const uint8_t* have, size_t n, int exponent,
                           uint32_t op_id, const Params& p, size_t block_begin,
                           size_t block_end, float* out);

}  // namespace optireduce
