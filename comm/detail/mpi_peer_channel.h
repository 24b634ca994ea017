// MpiPeerChannel: the watchdog's questions and answers between ranks, on a
// communicator of its own so that they never match the training's messages.
// Questions are empty messages; answers are the asked rank's Watchdog::status().
// Only the watchdog thread uses it (MPI_THREAD_MULTIPLE).
#pragma once

#include <mpi.h>

#include <list>
#include <string>
#include <utility>

#include "comm/watchdog.h"

namespace lockstep::comm::detail {

class MpiPeerChannel final : public PeerChannel {
 public:
  // Duplicates `parent` (collective).
  explicit MpiPeerChannel(MPI_Comm parent);
  ~MpiPeerChannel() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void serve(const std::function<std::string()>& status) override;
  std::vector<std::optional<PeerAnswer>> ask_all(
      Seconds grace, const std::function<std::string()>& status) override;

 private:
  void send(std::string text, int dest, int tag);
  void reap();  // forgets the sends that have completed

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::list<std::pair<MPI_Request, std::string>> sends_;  // in flight, with their buffers
};

}  // namespace lockstep::comm::detail
