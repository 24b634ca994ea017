// The communication watchdog (comm/watchdog.h): in-flight bookkeeping, the
// polling thread, and the failure message with the other ranks' states.
#include "comm/watchdog.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <sstream>

#include "engine/core/log.h"
#include "kernels/error.h"

namespace lockstep::comm {
namespace {

thread_local const OperationContext* t_context = nullptr;

double seconds_since(Watchdog::Clock::time_point start) {
  return Seconds(Watchdog::Clock::now() - start).count();
}

// The first line of a peer's status: the keys of its collectives in flight.
bool status_has_key(const std::string& status, const std::string& key) {
  std::istringstream keys(status.substr(0, status.find('\n')));
  std::string word;
  while (keys >> word)
    if (word == key) return true;
  return false;
}

std::string status_sentence(const std::string& status) {
  const auto newline = status.find('\n');
  return newline == std::string::npos ? status : status.substr(newline + 1);
}

}  // namespace

Seconds parse_timeout_seconds(std::string_view text) {
  double seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(seconds) ||
      seconds <= 0)
    throw InvalidArgument("LOCKSTEP_COMM_TIMEOUT='" + std::string(text) +
                          "' is not a positive number of seconds (e.g. 600 or 2.5)");
  return Seconds(seconds);
}

Seconds comm_timeout_from_env() {
  const char* text = std::getenv("LOCKSTEP_COMM_TIMEOUT");
  return text ? parse_timeout_seconds(text) : kDefaultCommTimeout;
}

std::string OperationInfo::key() const { return fmt::format("{}#{}", communicator, sequence); }

std::string OperationInfo::describe() const {
  std::string what =
      fmt::format("{} #{} on '{}' ({} {}", name, sequence, communicator, count, dtype_name(dtype));
  if (!context.empty()) what += "; " + context;
  what += ")";
  what += step >= 0 ? fmt::format(" at step {}", step) : std::string(" before the first step");
  return what;
}

OperationContext::OperationContext(std::string what) : what_(std::move(what)), outer_(t_context) {
  t_context = this;
}

OperationContext::~OperationContext() { t_context = outer_; }

const std::string& OperationContext::current() {
  static const std::string empty;
  return t_context ? t_context->what_ : empty;
}

Watchdog::Watchdog(Seconds timeout, Handler handler, std::unique_ptr<PeerChannel> peers)
    : timeout_(timeout), handler_(std::move(handler)), peers_(std::move(peers)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  peers_.reset();
}

Watchdog::Scope::Scope(Watchdog* watchdog, OperationInfo info) : watchdog_(watchdog) {
  if (watchdog_) item_ = watchdog_->add(std::move(info), {});
}

Watchdog::Scope::~Scope() {
  if (watchdog_) watchdog_->finish(item_);
}

std::list<Watchdog::Item>::iterator Watchdog::add(OperationInfo info, std::function<bool()> done) {
  info.step = step_;
  if (info.context.empty()) info.context = OperationContext::current();
  std::lock_guard lock(mutex_);
  in_flight_.push_back({std::move(info), Clock::now(), std::move(done)});
  return std::prev(in_flight_.end());
}

void Watchdog::finish(std::list<Item>::iterator item) {
  std::lock_guard lock(mutex_);
  last_finished_.emplace(std::move(item->info), Clock::now());
  in_flight_.erase(item);
}

void Watchdog::watch_async(OperationInfo info, std::function<bool()> done) {
  add(std::move(info), std::move(done));
}

int Watchdog::add_error_source(ErrorSource source) {
  std::lock_guard lock(mutex_);
  sources_.emplace_back(next_source_id_, std::move(source));
  return next_source_id_++;
}

void Watchdog::remove_error_source(int id) {
  std::lock_guard lock(mutex_);
  std::erase_if(sources_, [id](const auto& s) { return s.first == id; });
}

std::string Watchdog::in_flight_text() const {
  std::string text;
  for (const Item& item : in_flight_)
    text += fmt::format("{}waiting in {} for {:.1f} s", text.empty() ? "" : "; ",
                        item.info.describe(), seconds_since(item.start));
  return text;
}

std::string Watchdog::status() const {
  std::lock_guard lock(mutex_);
  std::string keys;
  for (const Item& item : in_flight_) {
    if (!keys.empty()) keys += ' ';
    keys += item.info.key();
  }
  if (!in_flight_.empty()) return keys + "\n" + in_flight_text();
  if (!last_finished_)
    return "\nnot in a collective; none has run yet (step " + std::to_string(step_.load()) + ")";
  return fmt::format("\nnot in a collective; the last one, {}, finished {:.1f} s ago",
                     last_finished_->first.describe(), seconds_since(last_finished_->second));
}

void Watchdog::run() {
  // Twenty checks per timeout bound the overshoot at 5%; checking at most every
  // 100 ms keeps the MPI probe in serve() cheap while peers still get prompt answers.
  const auto poll = std::chrono::duration_cast<Clock::duration>(
      std::clamp(timeout_ / 20, Seconds(0.001), Seconds(0.1)));
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll);
    if (stopping_) break;
    lock.unlock();
    const std::optional<Failure> failure = find_failure();
    if (peers_) {
      try {
        peers_->serve([this] { return status(); });
      } catch (const std::exception& e) {
        core::log_warn("watchdog: answering other ranks failed: {}", e.what());
      }
    }
    if (failure) report(*failure);
    lock.lock();
  }
}

std::optional<Watchdog::Failure> Watchdog::find_failure() {
  std::lock_guard lock(mutex_);
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    Item& item = *it;
    if (item.reported) {
      ++it;
      continue;
    }
    if (item.done) {
      try {
        if (item.done()) {
          last_finished_.emplace(std::move(item.info), Clock::now());
          it = in_flight_.erase(it);
          continue;
        }
      } catch (const std::exception& e) {
        item.reported = true;
        return Failure{item.info.describe() + " failed: " + e.what(), ""};
      }
    }
    const double waited = seconds_since(item.start);
    if (waited > timeout_.count()) {
      item.reported = true;
      const int ranks = peers_ ? peers_->size() : 1;
      return Failure{fmt::format("{} has not completed after {:.1f} s (LOCKSTEP_COMM_TIMEOUT is "
                                 "{:g} s); it is waiting for all {} ranks to join it",
                                 item.info.describe(), waited, timeout_.count(), ranks),
                     item.info.key()};
    }
    ++it;
  }
  for (auto source = sources_.begin(); source != sources_.end(); ++source) {
    std::optional<std::string> error;
    try {
      error = source->second();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error) {
      sources_.erase(source);  // a failed source stays failed: report it once
      std::string head = *error;
      head += in_flight_.empty() ? "; no collective was in flight" : "; " + in_flight_text();
      return Failure{head, ""};
    }
  }
  return std::nullopt;
}

void Watchdog::report(const Failure& failure) {
  std::string message = "watchdog: " + failure.head;
  if (peers_) {
    std::vector<std::optional<std::string>> answers;
    try {
      answers = peers_->ask_all(std::min(timeout_, Seconds(2.0)), [this] { return status(); });
    } catch (const std::exception& e) {
      message += fmt::format(". Asking the other ranks failed: {}", e.what());
    }
    for (std::size_t r = 0; r < answers.size(); ++r) {
      if (static_cast<int>(r) == peers_->rank()) continue;
      const auto& answer = answers[r];
      if (!answer)
        message += fmt::format("\n  rank {}: no answer (the process is dead or wedged)", r);
      else if (!failure.key.empty() && status_has_key(*answer, failure.key))
        message += fmt::format("\n  rank {} has joined it: {}", r, status_sentence(*answer));
      else if (!failure.key.empty())
        message += fmt::format("\n  rank {} has NOT joined it: {}", r, status_sentence(*answer));
      else
        message += fmt::format("\n  rank {}: {}", r, status_sentence(*answer));
    }
  }
  handler_(message);
}

}  // namespace lockstep::comm
