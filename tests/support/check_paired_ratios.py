#!/usr/bin/env python3
"""Checks comm_bench's ratio lines against its own rounds (--rounds N --print_rounds 1).

Every printed cell "SIZE RATIO" of a line "ratio OURS/RAW OP: ..." must be the mean over the
rounds of raw time / our time, the two times of one round paired, without the highest and
the lowest ratio (bench/README, "Pairing the rounds"). Exits 1 naming the first cell that is
not, or when no cell was found.
  check_paired_ratios.py LOG
"""
import re
import statistics
import sys


def short_size(nbytes):  # as comm_bench prints a size in a ratio line
    for unit, shift in (("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def main(path):
    checked = 0
    rounds = {}  # (table, op, size label) -> times; a run's ratio lines follow its rounds
    for line in open(path, encoding="utf-8"):
        if line.startswith("---- "):  # the next comm_bench run in the log
            rounds = {}
        elif line.startswith("rounds "):
            _, table, op, nbytes, *times = line.split()
            rounds[(table, op, short_size(int(nbytes)))] = [float(t) for t in times]
        elif m := re.match(r"ratio (\S+)/(\S+) (\S+):(.*)", line):
            ours, raw, op, cells = m.groups()
            for size, printed in re.findall(r" (\S+) ([0-9.]+) \(raw ", cells):
                if (ours, op, size) not in rounds or (raw, op, size) not in rounds:
                    sys.exit(f"{path}: {ours}/{raw} {op} {size}: printed without its rounds")
                o, r = rounds[(ours, op, size)], rounds[(raw, op, size)]
                each = sorted(b / a for a, b in zip(o, r))
                want = statistics.mean(each[1:-1] if len(each) > 2 else each)
                if len(o) < 2 or len(o) != len(r) or abs(float(printed) - want) > 0.0051:
                    sys.exit(f"{path}: {ours}/{raw} {op} {size}: printed {printed}, the trimmed "
                             f"mean of the rounds' ratios is {want:.4f} (ours {o}, raw {r})")
                checked += 1
    if checked == 0:
        sys.exit(f"{path}: no ratio cell with its rounds found")
    print(f"{checked} ratio cells are the trimmed mean of their rounds' ratios")


if __name__ == "__main__":
    main(sys.argv[1])
