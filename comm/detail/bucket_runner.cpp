// The communication thread and the communication stream
// (comm/detail/bucket_runner.h).
#include "comm/detail/bucket_runner.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/core/trace.h"

namespace lockstep::comm::detail {
namespace {

class ThreadRunner final : public BucketRunner {
 public:
  explicit ThreadRunner(Reduce reduce) : reduce_(std::move(reduce)), thread_([this] { loop(); }) {}

  // Reduces what was launched before stopping: every rank launched the same
  // buckets, so leaving some out would leave the other ranks waiting.
  ~ThreadRunner() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_one();
    thread_.join();
  }

  void launch(std::size_t bucket) override {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(bucket);
      ++launched_;
    }
    work_.notify_one();
  }

  void wait_all() override {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return completed_ == launched_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    core::trace::set_thread_name("comm");
    std::unique_lock lock(mutex_);
    while (true) {
      work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      const std::size_t bucket = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        reduce_(bucket, core::Stream());
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !error_) error_ = error;
      ++completed_;
      done_.notify_all();
    }
  }

  Reduce reduce_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable done_;
  std::deque<std::size_t> queue_;
  std::size_t launched_ = 0;
  std::size_t completed_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

class DeferredRunner final : public BucketRunner {
 public:
  explicit DeferredRunner(Reduce reduce) : reduce_(std::move(reduce)) {}

  void launch(std::size_t bucket) override { launched_.push_back(bucket); }

  // Every launched bucket is reduced even when one fails, so that this rank
  // issues the same collectives as the others; the first error is rethrown.
  void wait_all() override {
    std::exception_ptr error;
    for (std::size_t bucket : std::exchange(launched_, {})) {
      try {
        reduce_(bucket, core::Stream());
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  Reduce reduce_;
  std::vector<std::size_t> launched_;
};

class StreamRunner final : public BucketRunner {
 public:
  StreamRunner(Reduce reduce, core::Stream compute, core::Stream comm)
      : reduce_(std::move(reduce)), compute_(std::move(compute)), comm_(std::move(comm)) {}

  // The reductions in flight use memory that dies with the synchroniser.
  ~StreamRunner() override {
    try {
      comm_.synchronize();
    } catch (...) {  // a broken stream has reported its error already
    }
  }

  void launch(std::size_t bucket) override {
    gradients_written_.record(compute_);
    comm_.wait(gradients_written_);
    reduce_(bucket, comm_);
  }

  void wait_all() override {
    reduced_.record(comm_);
    compute_.wait(reduced_);
  }

 private:
  Reduce reduce_;
  core::Stream compute_;
  core::Stream comm_;
  core::Event gradients_written_;
  core::Event reduced_;
};

}  // namespace

std::unique_ptr<BucketRunner> make_thread_runner(BucketRunner::Reduce reduce) {
  return std::make_unique<ThreadRunner>(std::move(reduce));
}

std::unique_ptr<BucketRunner> make_deferred_runner(BucketRunner::Reduce reduce) {
  return std::make_unique<DeferredRunner>(std::move(reduce));
}

std::unique_ptr<BucketRunner> make_stream_runner(BucketRunner::Reduce reduce,
                                                 core::Stream compute_stream,
                                                 core::Stream comm_stream) {
  return std::make_unique<StreamRunner>(std::move(reduce), std::move(compute_stream),
                                        std::move(comm_stream));
}

}  // namespace lockstep::comm::detail
