#!/usr/bin/python3
"""PNG plots of the benchmarks' tables (Debian's python3-matplotlib; scripts/setup.sh --bench).

  plot_bench.py comm LOG PNG        comm_bench's output: bus bandwidth against message size,
                                    one line per communicator, one panel per operation (memcpy
                                    on one core drawn in each as the physical limit)
  plot_bench.py step TABLE PNG      run_step_bench.sh's ms-per-step table: one group of bars per
                                    model/optimizer, one bar per run (plain LibTorch, world 1,
                                    each communicator, PyTorch)
  plot_bench.py transformer MD PNG  run_transformer_bench.sh's Markdown table: the median step
                                    per strategy and unit mechanism, one group per world size
"""
import re
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
except ImportError:
    plt = None


def comm(log_path, png):
    series = {}  # (op, backend) -> [(bytes, busbw GB/s)]
    memcpy = []
    key = None
    for line in open(log_path):
        if line.strip() == "#":  # a table's end (the summary lines after it are not rows)
            key = None
            continue
        header = re.match(r"# backend (\S+)(?:\s+op (\S+))?", line)
        if header:
            key = (header.group(2), header.group(1))
            continue
        fields = line.split()
        if key is None or not fields or not fields[0].isdigit():
            continue
        if key[1] == "memcpy":
            memcpy.append((int(fields[0]), float(fields[3])))
        elif len(fields) >= 6:
            series.setdefault(key, []).append((int(fields[0]), float(fields[5])))
    ops = sorted({op for op, _ in series})
    if not ops:
        sys.exit("plot_bench: %s holds no comm_bench rows" % log_path)
    cols = min(2, len(ops))
    rows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops):
        for (o, backend), rows in sorted(series.items()):
            if o == op:
                ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", ms=3,
                        label=backend, linestyle="--" if backend.startswith("raw_") else "-")
        if memcpy:
            ax.plot([r[0] for r in memcpy], [r[1] for r in memcpy], color="gray", linestyle=":",
                    label="memcpy (1 core)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def bars(groups, columns, values, ylabel, title, png):
    """values[g][c]: a number or None; one group of bars per g."""
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * len(columns) / 3), 4))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        xs = [g + (i - (len(columns) - 1) / 2) * width for g in range(len(groups))]
        ys = [values[g][i] if values[g][i] is not None else 0 for g in range(len(groups))]
        ax.bar(xs, ys, width, label=column)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def number(text):
    match = re.match(r"[-+]?[0-9]*\.?[0-9]+", text.strip())
    return float(match.group(0)) if match else None


def step(table_path, png):
    lines = [l.split() for l in open(table_path) if l.strip()]
    if len(lines) < 2:
        sys.exit("plot_bench: %s holds no table rows" % table_path)
    columns = lines[0][1:]
    groups = [l[0] for l in lines[1:]]
    values = [[number(v) for v in l[1:]] for l in lines[1:]]
    bars(groups, columns, values, "ms per step (median)",
         "training step: plain LibTorch, ours at world 1, DDP at world 2 per communicator, "
         "PyTorch where installed", png)


def transformer(md_path, png):
    rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in open(md_path)
            if l.startswith("|") and re.match(r"\|\s*\d", l)]
    if not rows:
        sys.exit("plot_bench: %s holds no table rows" % md_path)
    worlds = sorted({r[0] for r in rows}, key=int)
    columns = []
    for r in rows:
        name = r[1] if r[2] in ("", "-") else "%s (%s)" % (r[1], r[2])
        if name not in columns:
            columns.append(name)
    values = [[None] * len(columns) for _ in worlds]
    for r in rows:
        name = r[1] if r[2] in ("", "-") else "%s (%s)" % (r[1], r[2])
        values[worlds.index(r[0])][columns.index(name)] = number(r[4])
    bars(["world %s" % w for w in worlds], columns, values, "median step (s)",
         "LibTorch transformer: DDP, ZeRO-2, ZeRO-3 per unit mechanism", png)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("comm", "step", "transformer"):
        sys.exit(__doc__)
    if plt is None:  # the benchmark's tables stand without it
        print("plot_bench: no plot %s: python3-matplotlib is not installed "
              "(scripts/setup.sh --bench)" % sys.argv[3], file=sys.stderr)
        sys.exit(0)
    {"comm": comm, "step": step, "transformer": transformer}[sys.argv[1]](sys.argv[2], sys.argv[3])
    print("plot: %s" % sys.argv[3])
