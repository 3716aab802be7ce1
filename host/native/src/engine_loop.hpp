// The thread of a live runtime (LiveNic in live.hpp, ReliableLive in reliable_live.hpp): the
// loop that runs its turns, the eventfd that wakes it, the calls other threads make into it
// and how it ends. Every wait is bounded; stop() joins.
//
// The owner keeps its own state; what callers share with the thread is guarded by mu(), the
// loop's mutex, which also guards the loop's exited/failed/error. The owner starts the loop
// last in its constructor and stops it first in its destructor (the thread uses its members).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace optireduce {

class EngineLoop {
public:
    // label names the thread in errors ("the engine thread"); throws std::system_error
    explicit EngineLoop(std::string label);
    ~EngineLoop();  // stop()
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;

    // Starts the thread (named `name`, as top shows it): `turn` runs until stop() or until
    // it throws (recorded: failed(), error()); then the calls still queued are refused, the
    // loop is marked exited and `on_exit` runs on the thread (to wake the owner's waiters).
    void start(const std::string& name, std::function<void()> turn,
               std::function<void()> on_exit);
    void stop();  // idempotent
    bool stopping() const { return stop_.load(std::memory_order_relaxed); }
    void wake();

    // Runs fn on the loop thread between two turns and waits up to timeout_us for it;
    // rethrows what fn threw. `what` names the call in errors.
    void call(std::function<void()> fn, int64_t timeout_us, const char* what);
    // On the loop thread: run the queued calls.
    void run_calls();
    // On the loop thread: sleep until fd is readable (or writable too, with want_out), a
    // wake-up, or timeout_us (nothing when <= 0).
    void sleep_io(int fd, int64_t timeout_us, bool want_out);

    int64_t now_us() const;  // CLOCK_MONOTONIC microseconds since construction
    int64_t t0_ns() const { return t0_ns_; }

    std::mutex& mu() { return mu_; }
    // under mu()
    bool exited() const { return exited_; }
    bool failed() const { return failed_; }
    const std::string& error() const { return error_; }
    // under mu(): throws std::runtime_error "<what>: <label> has stopped (<error>)" if exited
    void check_running(const char* what) const;

private:
    struct Call {
        std::function<void()> fn;
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        std::exception_ptr error;
    };
    void run(const std::string& name, const std::function<void()>& turn,
             const std::function<void()>& on_exit);
    static void finish(Call& c);

    std::string label_;
    int wake_fd_ = -1;
    int64_t t0_ns_ = 0;
    std::mutex mu_;
    std::deque<std::shared_ptr<Call>> calls_;
    bool exited_ = false, failed_ = false;
    std::string error_;
    std::atomic<bool> stop_{false};
    std::thread thread_;
};

}  // namespace optireduce
