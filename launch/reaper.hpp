#pragma once
// Finding and ending every process a job left behind. Killing each worker's process group
// catches the children that stayed in it; a descendant that left the group (setsid, setpgid,
// a daemonising double fork) is only found because the launcher is a child subreaper: when
// its parent dies it is reparented to the launcher instead of to init, and so shows up as one
// of our children.

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace accel::launch {

// PR_SET_CHILD_SUBREAPER for this process. Returns false where the kernel refuses (then only
// the workers' process groups can be cleaned up).
bool become_child_subreaper();

// Live (not zombie) processes that are members of one of `process_groups`, plus, when
// `children` is true, every child of this process with its descendants. Never this process.
std::vector<pid_t> leftover_processes(const std::vector<pid_t>& process_groups, bool children);

// Reaps every child of this process that has exited, without blocking. Only for a process
// whose every child is ours to reap (the launcher): it would take exit statuses others wait for.
void reap_exited_children();

// SIGTERM to every leftover, up to `grace` for them to go, then SIGKILL, until none remain or
// `grace` + 5 s have passed. Reaps our own children when `children` is true. Returns how many
// were still alive at the end (0 unless something is unkillable, e.g. stuck in the kernel).
std::size_t end_leftovers(const std::vector<pid_t>& process_groups, bool children,
                          std::chrono::milliseconds grace);

}  // namespace accel::launch
