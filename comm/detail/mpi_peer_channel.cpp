// MpiPeerChannel (comm/detail/mpi_peer_channel.h).
#include "comm/detail/mpi_peer_channel.h"

#include <chrono>
#include <thread>

#include "comm/detail/check_mpi.h"

namespace lockstep::comm::detail {
namespace {

constexpr int kQuestionTag = 1;
constexpr int kAnswerTag = 2;
// Answers stay small, so that MPI sends them eagerly and a send never waits
// for a peer that is not listening.
constexpr std::size_t kMaxAnswerBytes = 2000;

}  // namespace

MpiPeerChannel::MpiPeerChannel(MPI_Comm parent) {
  LOCKSTEP_CHECK_MPI(MPI_Comm_dup(parent, &comm_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiPeerChannel::~MpiPeerChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Sends are left only after a failure whose handler returned (tests); they
  // are small eager messages, so cancelling and waiting ends at once.
  for (auto& [request, text] : sends_) {
    MPI_Cancel(&request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&comm_);
}

void MpiPeerChannel::send(std::string text, int dest, int tag) {
  if (text.size() > kMaxAnswerBytes) text.resize(kMaxAnswerBytes);
  auto& [request, buffer] = sends_.emplace_back(MPI_REQUEST_NULL, std::move(text));
  LOCKSTEP_CHECK_MPI(MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_CHAR, dest, tag,
                               comm_, &request));
}

void MpiPeerChannel::reap() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    LOCKSTEP_CHECK_MPI(MPI_Test(&it->first, &done, MPI_STATUS_IGNORE));
    it = done ? sends_.erase(it) : std::next(it);
  }
}

void MpiPeerChannel::serve(const std::function<std::string()>& status) {
  while (true) {
    int pending = 0;
    MPI_Status probe;
    LOCKSTEP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kQuestionTag, comm_, &pending, &probe));
    if (!pending) break;
    LOCKSTEP_CHECK_MPI(
        MPI_Recv(nullptr, 0, MPI_BYTE, probe.MPI_SOURCE, kQuestionTag, comm_, MPI_STATUS_IGNORE));
    send(status(), probe.MPI_SOURCE, kAnswerTag);
  }
  reap();
}

std::vector<std::optional<PeerAnswer>> MpiPeerChannel::ask_all(
    Seconds grace, const std::function<std::string()>& status) {
  std::vector<std::optional<PeerAnswer>> answers(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    if (r != rank_) send("", r, kQuestionTag);
  int missing = size_ - 1;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    serve(status);  // the asked ranks may be asking us at the same moment
    int arrived = 0;
    MPI_Status probe;
    LOCKSTEP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, comm_, &arrived, &probe));
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    int length = 0;
    LOCKSTEP_CHECK_MPI(MPI_Get_count(&probe, MPI_CHAR, &length));
    std::string answer(static_cast<std::size_t>(length), '\0');
    LOCKSTEP_CHECK_MPI(MPI_Recv(answer.data(), length, MPI_CHAR, probe.MPI_SOURCE, kAnswerTag,
                                comm_, MPI_STATUS_IGNORE));
    auto& slot = answers[static_cast<std::size_t>(probe.MPI_SOURCE)];
    if (!slot) --missing;
    slot = PeerAnswer{std::move(answer), std::chrono::steady_clock::now()};
  }
  return answers;
}

}  // namespace lockstep::comm::detail
