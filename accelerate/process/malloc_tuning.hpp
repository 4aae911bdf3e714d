#pragma once
// Keeps freed memory for reuse instead of handing it back to the OS (glibc malloc).
//
// A training step frees and allocates the same tensor sizes every step. glibc's defaults
// return the top of the heap to the OS once more than its trim threshold is free there, and
// whether that happens depends on where small long-lived allocations landed: one program
// differing from another by an allocation or two can trim and regrow its heap several times a
// step, every regrown page a fault (fashion_mnist at world 1, stdout to a file: 5.5 s of
// system time in a 15 s epoch against 0.5 s; bench/journal/2026-12-05, "Freed memory kept for
// reuse"). Blocks above the mmap threshold (dynamic, at most 32 MiB) are mapped fresh and unmapped
// on every allocation: mlp25m's Adam step faults 65k pages a step (step_bench, world 1: 290 ms a
// step, 176 with this). With this, as `accel launch` sets GLIBC_TUNABLES for its CPU workers:
// blocks up to 2 GiB come from the heap, the heap is trimmed only past 2 GiB free at its top (a
// process keeps the memory of its largest step), and threads share one arena. The Accelerator calls
// it for CPU work in a process started without those tunables (run directly, under mpirun or
// torchrun).
//
// Left alone when the process's GLIBC_TUNABLES already sets a glibc.malloc tunable, or when
// ACCEL_MALLOC_TUNING=0.

namespace accel {

// Whether it changed malloc's settings. Idempotent; call before the training loop allocates.
bool tune_malloc_for_training();

}  // namespace accel
