// The thread of a live runtime: see engine_loop.hpp.
#include "engine_loop.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <system_error>

namespace optireduce {

namespace {

int64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace

EngineLoop::EngineLoop(std::string label) : label_(std::move(label)) {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
    t0_ns_ = mono_ns();
}

EngineLoop::~EngineLoop() {
    stop();
    close(wake_fd_);
}

int64_t EngineLoop::now_us() const { return (mono_ns() - t0_ns_) / 1000; }

void EngineLoop::start(const std::string& name, std::function<void()> turn,
                       std::function<void()> on_exit) {
    thread_ = std::thread([this, name, turn = std::move(turn), on_exit = std::move(on_exit)] {
        run(name, turn, on_exit);
    });
}

void EngineLoop::stop() {
    stop_.store(true);
    wake();
    if (thread_.joinable()) thread_.join();
}

void EngineLoop::wake() {
    const uint64_t one = 1;
    ssize_t r = write(wake_fd_, &one, sizeof one);  // EAGAIN: the counter is already set
    (void)r;
}

void EngineLoop::check_running(const char* what) const {
    if (exited_)
        throw std::runtime_error(std::string(what) + ": " + label_ + " has stopped" +
                                 (error_.empty() ? "" : " (" + error_ + ")"));
}

void EngineLoop::call(std::function<void()> fn, int64_t timeout_us, const char* what) {
    auto c = std::make_shared<Call>();
    c->fn = std::move(fn);
    {
        std::lock_guard<std::mutex> lk(mu_);
        check_running(what);
        calls_.push_back(c);
    }
    wake();
    std::unique_lock<std::mutex> lk(c->m);
    if (!c->cv.wait_for(lk, std::chrono::microseconds(timeout_us), [&] { return c->done; }))
        throw std::runtime_error(std::string(what) + ": " + label_ + " did not answer within " +
                                 std::to_string(timeout_us) + " us");
    if (c->error) std::rethrow_exception(c->error);
}

void EngineLoop::finish(Call& c) {
    {
        std::lock_guard<std::mutex> lk(c.m);
        c.done = true;
    }
    c.cv.notify_all();
}

void EngineLoop::run_calls() {
    std::deque<std::shared_ptr<Call>> calls;
    {
        std::lock_guard<std::mutex> lk(mu_);
        calls.swap(calls_);
    }
    for (auto& c : calls) {
        try {
            c->fn();
        } catch (...) {
            c->error = std::current_exception();
        }
        finish(*c);
    }
}

void EngineLoop::run(const std::string& name, const std::function<void()>& turn,
                     const std::function<void()>& on_exit) {
    prctl(PR_SET_TIMERSLACK, 10000UL);  // 10 us: the deadlines are in microseconds
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    try {
        while (!stop_.load(std::memory_order_relaxed)) turn();
    } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu_);
        failed_ = true;
        error_ = e.what();
    }
    std::deque<std::shared_ptr<Call>> left;
    {
        std::lock_guard<std::mutex> lk(mu_);
        exited_ = true;
        left.swap(calls_);
    }
    for (auto& c : left) {
        c->error = std::make_exception_ptr(std::runtime_error(label_ + " has stopped"));
        finish(*c);
    }
    on_exit();
}

void EngineLoop::sleep_io(int fd, int64_t timeout_us, bool want_out) {
    if (timeout_us <= 0) return;
    pollfd fds[2] = {{fd, static_cast<short>(POLLIN | (want_out ? POLLOUT : 0)), 0},
                     {wake_fd_, POLLIN, 0}};
    const timespec ts{static_cast<time_t>(timeout_us / 1000000),
                      static_cast<long>(timeout_us % 1000000) * 1000};
    const int r = ppoll(fds, 2, &ts, nullptr);
    if (r < 0 && errno != EINTR) throw std::system_error(errno, std::generic_category(), "ppoll");
    if (r > 0 && (fds[1].revents & POLLIN)) {
        uint64_t v;
        ssize_t n = read(wake_fd_, &v, sizeof v);
        (void)n;
    }
}

}  // namespace optireduce
