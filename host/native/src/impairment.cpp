// Seeded impairment and the release-time queue: see impairment.hpp. Each draw follows
// host/model/impairment.py in the same order (duplicate?, then per copy: lost?, delay,
// reordered?), so the rates and distributions are the model's.
#include "impairment.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace optireduce {

void ImpairmentSpec::check() const {
    auto bad = [](const char* field, double v, const char* rule) {
        throw std::invalid_argument(std::string("ImpairmentSpec.") + field + "=" +
                                    std::to_string(v) + ": " + rule);
    };
    if (!(median_us >= 0) || !std::isfinite(median_us)) bad("median_us", median_us, "must be >= 0");
    if (!(p99_ratio >= 1) || !std::isfinite(p99_ratio)) bad("p99_ratio", p99_ratio, "must be >= 1");
    if (!(loss >= 0 && loss < 1)) bad("loss", loss, "must be in [0, 1)");
    if (!(duplicate >= 0 && duplicate < 1)) bad("duplicate", duplicate, "must be in [0, 1)");
    if (!(reorder >= 0 && reorder < 1)) bad("reorder", reorder, "must be in [0, 1)");
    if (!(extra_us >= 0) || !std::isfinite(extra_us)) bad("extra_us", extra_us, "must be >= 0");
}

double ImpairmentSpec::sigma() const { return std::log(p99_ratio) / Z99; }

Impairment::Impairment(const ImpairmentSpec& spec, uint64_t seed) : rng_(seed) {
    set_spec(spec);
}

void Impairment::set_spec(const ImpairmentSpec& spec) {
    spec.check();
    spec_ = spec;
    sigma_ = spec.sigma();
}

double Impairment::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

double Impairment::delay_us() {
    const ImpairmentSpec& s = spec_;
    if (s.median_us == 0) return s.extra_us;
    double d = sigma_ != 0 ? s.median_us * std::exp(sigma_ * normal_(rng_)) : s.median_us;
    d += s.extra_us;
    if (s.reorder != 0 && uniform() < s.reorder) {
        reordered += 1;
        d += s.median_us;
    }
    return d;
}

int Impairment::fates(double out[2]) {
    const ImpairmentSpec& s = spec_;
    int copies = 1;
    if (s.duplicate != 0 && uniform() < s.duplicate) {
        copies = 2;
        duplicated += 1;
    }
    int k = 0;
    for (int c = 0; c < copies; ++c) {
        if (s.loss != 0 && uniform() < s.loss) {
            lost += 1;
            continue;
        }
        out[k++] = delay_us();
    }
    return k;
}

// ---- release queue -----------------------------------------------------------------------

uint32_t ReleaseQueue::take_slot() {
    if (!free_.empty()) {
        const uint32_t s = free_.back();
        free_.pop_back();
        return s;
    }
    slots_.push_back(std::make_unique<uint8_t[]>(slot_bytes_));
    return static_cast<uint32_t>(slots_.size() - 1);
}

void ReleaseQueue::push(int64_t due_us, int dst, const uint8_t* data, size_t len) {
    if (len > slot_bytes_)
        throw std::logic_error("ReleaseQueue: a datagram of " + std::to_string(len) +
                               " bytes exceeds " + std::to_string(slot_bytes_));
    const uint32_t s = take_slot();
    std::memcpy(slots_[s].get(), data, len);
    heap_.push_back(Entry{due_us, seq_++, dst, s, static_cast<uint32_t>(len)});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
}

std::optional<int64_t> ReleaseQueue::next() const {
    if (heap_.empty()) return std::nullopt;
    return heap_.front().due;
}

size_t ReleaseQueue::pop_due(int64_t now, size_t max, std::vector<OutDatagram>& out) {
    out.clear();
    popped_.clear();
    while (!heap_.empty() && heap_.front().due <= now && popped_.size() < max) {
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
        const Entry e = heap_.back();
        heap_.pop_back();
        popped_.push_back(e);
        out.push_back(OutDatagram{e.dst, slots_[e.slot].get(), e.len});
    }
    return out.size();
}

void ReleaseQueue::done(size_t sent) {
    for (size_t i = 0; i < popped_.size(); ++i) {
        if (i < sent) {
            free_.push_back(popped_[i].slot);
        } else {  // same due tick and sequence number: the same place in the order
            heap_.push_back(popped_[i]);
            std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
        }
    }
    popped_.clear();
}

}  // namespace optireduce
