// The communication watchdog (comm/watchdog.h): in-flight bookkeeping, the
// polling thread, and the failure message with the other ranks' states.
//
// Note [busy ranks]: a collective that outlives the timeout is not a failure
// yet when the ranks it waits for are busy on purpose: rank 0 writing a
// checkpoint, for longer than LOCKSTEP_COMM_TIMEOUT, while the others wait in
// the next step's allreduce. The watchdog asks the other ranks first; when
// every one answers, at least one is busy (Watchdog::Busy), and each of the
// rest has joined this collective or waits in another one, it logs whom it
// waits for and gives the collective another timeout. A rank that does not
// answer (dead, stopped, cut off) or that is idle outside any collective
// still ends the job at the first timeout. A busy rank's own work is not
// timed: a save that never ends keeps the others waiting, one log line per
// timeout, until the job's time limit.
//
// Note [flight dumps]: every rank that can writes its flight recorder when a
// collective fails: the failing rank before it reports, and every rank it
// asks before answering (a question comes only after a failure or a timeout),
// so the dumps are on disk before the report's handler ends the job. A rank
// that cannot answer (stopped, dead) leaves none; tools/flight.py says so.
//
// Note [liveness check]: the dumps alone cannot always name a stopped rank.
// One stopped inside a collective that every rank has issued shows it
// started, as the others do, in the dump it leaves once the job's end wakes
// it. What does name it is the question the watchdog asks before it reports:
// the stopped rank does not answer within the grace, or answers only once the
// job's end has woken it. So the watchdog keeps that finding in its flight
// recorder (when it asked, when it stopped waiting, which ranks answered and
// when each answer arrived, which did not), every dump carries the last one,
// and tools/flight.py names the ranks that no check heard before the first
// dump.
#include "comm/watchdog.h"

#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#include "engine/core/log.h"
#include "engine/core/output_file.h"
#include "kernels/error.h"

namespace lockstep::comm {
namespace {

thread_local const OperationContext* t_context = nullptr;

double seconds_since(Watchdog::Clock::time_point start) {
  return Seconds(Watchdog::Clock::now() - start).count();
}

// A peer's Watchdog::status(), in its three parts.
struct PeerStatus {
  std::string keys;  // of its collectives in flight, space-separated
  std::string busy;  // what it is busy with; empty when it is not
  std::string sentence;

  explicit PeerStatus(const std::string& status) {
    const auto first = status.find('\n');
    const auto second = first == std::string::npos ? first : status.find('\n', first + 1);
    if (second == std::string::npos) {
      sentence = status;
      return;
    }
    keys = status.substr(0, first);
    busy = status.substr(first + 1, second - first - 1);
    sentence = status.substr(second + 1);
  }
  bool has_key(const std::string& key) const {
    std::istringstream words(keys);
    std::string word;
    while (words >> word)
      if (word == key) return true;
    return false;
  }
  bool in_collective() const { return !keys.empty(); }
};

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

OperationContext::OperationContext(std::string what, std::int64_t bucket)
    : what_(std::move(what)), bucket_(bucket), outer_(t_context) {
  t_context = this;
}

OperationContext::~OperationContext() { t_context = outer_; }

const std::string& OperationContext::current() {
  static const std::string empty;
  return t_context ? t_context->what_ : empty;
}

std::int64_t OperationContext::current_bucket() { return t_context ? t_context->bucket_ : -1; }

std::string OperationContext::current_bucket_label() {
  const std::int64_t bucket = current_bucket();
  return bucket >= 0 ? fmt::format("bucket {}", bucket) : std::string();
}

Watchdog::Watchdog(Seconds timeout, Handler handler, std::unique_ptr<PeerChannel> peers)
    : timeout_(timeout),
      handler_(std::move(handler)),
      peers_(std::move(peers)),
      rank_(peers_ ? peers_->rank() : 0),
      size_(peers_ ? peers_->size() : 1),
      seen_flight_signals_(flight_signal_count()) {
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

Watchdog::Scope::Scope(Watchdog* watchdog, OperationInfo info, bool enqueue_only)
    : watchdog_(watchdog), uncaught_(std::uncaught_exceptions()) {
  if (core::trace::active()) {
    span_.open(enqueue_only ? fmt::format("enqueue {}", info.name) : std::string(info.name),
               OperationContext::current_bucket_label(), "comm");
  }
  if (watchdog_) item_ = watchdog_->add(std::move(info), {}, enqueue_only);
}

Watchdog::Scope::~Scope() {
  if (watchdog_) watchdog_->finish(item_, std::uncaught_exceptions() > uncaught_);
}

Watchdog::Busy::Busy(Watchdog* watchdog, std::string what) : watchdog_(watchdog) {
  if (!watchdog_) return;
  std::replace(what.begin(), what.end(), '\n', ' ');  // status() is line-based
  std::lock_guard lock(watchdog_->mutex_);
  outer_ = std::move(watchdog_->busy_);
  watchdog_->busy_.emplace(std::move(what), Clock::now());
}

Watchdog::Busy::~Busy() {
  if (!watchdog_) return;
  std::lock_guard lock(watchdog_->mutex_);
  watchdog_->busy_ = std::move(outer_);
}

std::list<Watchdog::Item>::iterator Watchdog::add(OperationInfo info, std::function<bool()> done,
                                                  bool enqueue_only) {
  info.step = step_;
  if (info.context.empty()) info.context = OperationContext::current();
  if (info.bucket < 0) info.bucket = OperationContext::current_bucket();
  std::lock_guard lock(mutex_);
  // An asynchronous collective's record was made when it was enqueued.
  FlightRecorder::Ticket ticket = 0;
  if (!done || !flight_.find(info, ticket)) ticket = flight_.record(info, !enqueue_only && !done);
  in_flight_.push_back({std::move(info), Clock::now(), std::move(done), false, next_item_id_++,
                        ticket, enqueue_only});
  return std::prev(in_flight_.end());
}

void Watchdog::finish(std::list<Item>::iterator item, bool failed) {
  std::lock_guard lock(mutex_);
  if (failed)
    flight_.fail(item->flight);
  else if (!item->enqueue_only)
    flight_.complete(item->flight);
  last_finished_.emplace(std::move(item->info), Clock::now());
  in_flight_.erase(item);
}

void Watchdog::watch_async(OperationInfo info, std::function<bool()> done) {
  add(std::move(info), std::move(done), false);
}

std::vector<FlightRecord> Watchdog::flight_records() const {
  std::lock_guard lock(mutex_);
  return flight_.records();
}

std::filesystem::path Watchdog::dump_flight(std::string_view reason) {
  std::string text;
  {
    std::lock_guard lock(mutex_);
    text = flight_.json(rank_, size_, step_, reason);
  }
  const std::filesystem::path directory = flight_directory();
  const std::filesystem::path path = directory / flight_file_name(rank_);
  std::lock_guard writing(dump_mutex_);  // abort's dump may meet the watchdog thread's
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  try {
    core::write_file(path, text, "the flight dump");  // Note [one way to write a file]
  } catch (const core::OutputFileError& e) {
    // Note [write failures] in engine/core/log.h: said whatever the log level.
    core::report_write_failure(
        "the flight dump " + path.string(),
        fmt::format("{} (set LOCKSTEP_FLIGHT_DIR to a writable directory with free space)",
                    e.reason()));
    return {};
  }
  return path;
}

std::string Watchdog::answer_peer() {
  // Note [flight dumps]; once per timeout, as all the failing ranks may ask at once.
  const Clock::time_point now = Clock::now();
  if (!last_peer_dump_ || now - *last_peer_dump_ > timeout_) {
    last_peer_dump_ = now;
    dump_flight("another rank asked after a failed or overdue collective");
  }
  return status();
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
  const std::string busy =
      busy_ ? fmt::format("{} for {:.1f} s", busy_->first, seconds_since(busy_->second)) : "";
  const std::string head = keys + "\n" + busy + "\n";
  if (!in_flight_.empty()) return head + in_flight_text();
  if (busy_) return head + "not in a collective: busy " + busy;
  if (!last_finished_)
    return head + "not in a collective; none has run yet (step " + std::to_string(step_.load()) +
           ")";
  return head + fmt::format("not in a collective; the last one, {}, finished {:.1f} s ago",
                            last_finished_->first.describe(),
                            seconds_since(last_finished_->second));
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
    dump_on_signal();
    const std::optional<Failure> failure = find_failure();
    if (peers_) {
      try {
        peers_->serve([this] { return answer_peer(); });
      } catch (const std::exception& e) {
        core::log_warn("watchdog: answering other ranks failed: {}", e.what());
      }
    }
    if (failure) handle(*failure);
    lock.lock();
  }
  lock.unlock();
  dump_on_signal();  // a signal that came in the last poll
}

void Watchdog::dump_on_signal() {
  const std::uint64_t signals = flight_signal_count();
  if (signals == seen_flight_signals_) return;
  seen_flight_signals_ = signals;  // Note [flight signal], flight_recorder.cpp
  const std::filesystem::path path = dump_flight("SIGUSR2");
  if (!path.empty()) core::log_info("flight recorder: SIGUSR2: wrote {}", path.string());
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
          flight_.complete(item.flight);
          last_finished_.emplace(std::move(item.info), Clock::now());
          it = in_flight_.erase(it);
          continue;
        }
      } catch (const std::exception& e) {
        item.reported = true;
        flight_.fail(item.flight);
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
                     item.info.key(), item.id};
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

void Watchdog::handle(const Failure& failure) {
  Answers answers;
  std::string ask_error;
  if (peers_) {
    const Seconds grace = std::min(timeout_, Seconds(2.0));
    const Clock::time_point asked = Clock::now();
    try {
      answers = peers_->ask_all(grace, [this] { return answer_peer(); });
    } catch (const std::exception& e) {
      ask_error = e.what();
    }
    if (ask_error.empty()) {  // Note [liveness check]
      LivenessCheck check;
      check.grace_s = grace.count();
      std::lock_guard lock(mutex_);
      check.asked_ns = flight_.ns_of(asked);
      check.ended_ns = flight_.ns_of(Clock::now());
      for (std::size_t r = 0; r < answers.size(); ++r) {
        if (static_cast<int>(r) == rank_) continue;
        if (!answers[r]) {
          check.silent.push_back(static_cast<int>(r));
          continue;
        }
        check.answered.push_back(static_cast<int>(r));
        check.answered_ns.push_back(flight_.ns_of(answers[r]->arrived));
      }
      flight_.record_liveness(std::move(check));
    }
  }
  if (ask_error.empty() && wait_for_busy_ranks(failure, answers)) return;
  report(failure, answers, ask_error);
}

bool Watchdog::wait_for_busy_ranks(const Failure& failure, const Answers& answers) {
  if (failure.key.empty() || !peers_) return false;
  std::string busy;  // "rank 0 (saving checkpoint ckpt-12.h5 for 6.1 s)"
  for (std::size_t r = 0; r < answers.size(); ++r) {
    if (static_cast<int>(r) == peers_->rank()) continue;
    if (!answers[r]) return false;
    const PeerStatus peer(answers[r]->status);
    if (!peer.busy.empty())
      busy += fmt::format("{}rank {} ({})", busy.empty() ? "" : ", ", r, peer.busy);
    else if (!peer.in_collective())
      return false;
  }
  if (busy.empty()) return false;
  std::lock_guard lock(mutex_);
  const auto item = std::find_if(in_flight_.begin(), in_flight_.end(),
                                 [&](const Item& i) { return i.id == failure.item_id; });
  if (item == in_flight_.end()) return true;  // it finished meanwhile
  core::log_info("watchdog: {} has waited {:.1f} s for {}; waiting another {:g} s",
                 item->info.describe(), seconds_since(item->start), busy, timeout_.count());
  item->start = Clock::now();
  item->reported = false;
  return true;
}

void Watchdog::report(const Failure& failure, const Answers& answers,
                      const std::string& ask_error) {
  std::string message = "watchdog: " + failure.head;
  if (!ask_error.empty()) message += ". Asking the other ranks failed: " + ask_error;
  std::string silent;  // the ranks that did not answer
  for (std::size_t r = 0; peers_ && r < answers.size(); ++r) {
    if (static_cast<int>(r) == peers_->rank()) continue;
    if (!answers[r]) {
      message += fmt::format("\n  rank {}: no answer (the process is dead, stopped or cut off)", r);
      silent += fmt::format("{}{}", silent.empty() ? "" : ", ", r);
      continue;
    }
    const PeerStatus peer(answers[r]->status);
    if (!failure.key.empty() && peer.has_key(failure.key))
      message += fmt::format("\n  rank {} has joined it: {}", r, peer.sentence);
    else if (!failure.key.empty())
      message += fmt::format("\n  rank {} has NOT joined it: {}", r, peer.sentence);
    else
      message += fmt::format("\n  rank {}: {}", r, peer.sentence);
  }
  if (!silent.empty()) message += fmt::format("\n  ranks that did not answer: {}", silent);
  const std::filesystem::path dump = dump_flight(message);  // Note [flight dumps]
  if (!dump.empty())
    message += fmt::format(
        "\n  flight recorder: this rank wrote {}, and so did each rank that answered; "
        "to see which rank stopped where, run: python3 tools/flight.py {}",
        dump.string(), dump.parent_path().string());
  handler_(message);
}

}  // namespace lockstep::comm
