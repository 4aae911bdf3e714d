#pragma once
// Gloo's TCP device, its event-loop thread kept from preempting the callers.
//
// A device runs one thread that reads every socket (level-triggered epoll) and hands each
// message to the waiting caller. When a message arrives while the caller is still inside Gloo
// holding that pair's lock (sending the rest of a step), the woken loop thread preempts it,
// fails to take the lock (Pair::handleEvents only try-locks) and polls again at once: the data
// is still there. On a shared core it spins like that until the scheduler's tick (4 ms at
// HZ=250) lets the caller run and release the lock. That was Gloo's coin toss on the 2-core VM:
// a 32 KiB all_reduce took 3.5-4.4 ms with each rank bound to one core, 0.3-4 ms unbound,
// depending on where the threads landed (bench/README, "Gloo's event-loop thread").
//
// SCHED_BATCH takes wakeup preemption away from that one thread; it still gets its full share
// of the core, at the next tick or as soon as the caller waits. Gloo does not expose the
// thread, so it is found as the one thread the device's construction started.
//   ACCEL_GLOO_LOOP_BATCH   1 (default): the loop thread runs SCHED_BATCH; 0: as Gloo leaves it

#include <memory>
#include <string>

namespace gloo::transport {
class Device;
}

namespace accel {

// A Gloo TCP device on `hostname` (empty: Gloo's default), its loop thread named
// accel-gloo-io and, unless ACCEL_GLOO_LOOP_BATCH=0, scheduled SCHED_BATCH.
std::shared_ptr<gloo::transport::Device> make_tcp_device(const std::string& hostname);

}  // namespace accel
