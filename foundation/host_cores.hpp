#pragma once
// What this host gives a rank to run on: its cores, and how many ranks the launcher put here.
// The communicators decide by it whether a waiter spins and whether their worker thread can
// run beside the caller.

namespace accel {

// Cores the host has online.
int online_cores();

// Cores this process may run on: its affinity mask (mpirun --bind-to core leaves one).
int usable_cores();

// Ranks the launcher started on this host: LOCAL_WORLD_SIZE (accel launch, torchrun), else
// OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI), else MPI_LOCALNRANKS (MPICH's Hydra); 0 when none
// says (or says something that is not a positive number).
int ranks_on_this_host();

// Whether a communicator's worker thread can run while the caller computes: the process may
// use two cores or more, and the host has more cores than ranks (ranks_here 0: not known,
// assumed so). Otherwise the worker shares the ranks' cores: it can still take the wait for
// a peer off the caller, but not compute beside it.
bool worker_can_overlap(int ranks_here, int online, int usable);
bool worker_can_overlap();  // this process, on this host

}  // namespace accel
