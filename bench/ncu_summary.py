"""Per-kernel GPU time from Nsight Compute CSV reports (bench/cuda_kernel_profile.sh writes them).

    python3 bench/ncu_summary.py REPORT.csv [REPORT.csv ...]

For each report and kernel: how many launches were profiled and the median and minimum duration
(`gpu__time_duration.sum`) of the later half of them, so that first launches (compilation,
autotuning, cold caches) do not count.
"""
import csv
import sys
from collections import defaultdict


def rows(path):
    # ncu prints its own log lines before the CSV; the CSV's lines all start with a quote
    with open(path) as f:
        return list(csv.DictReader(line for line in f if line.startswith('"')))


def summary(path):
    by_kernel = defaultdict(list)
    for r in rows(path):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            by_kernel[r["Kernel Name"]].append(float(r["Metric Value"].replace(",", "")))
    print(f"== {path}")
    for name, ns in by_kernel.items():
        later = sorted(ns[len(ns) // 2:])
        print(f"  launches={len(ns):5d} median_us={later[len(later) // 2] / 1e3:9.1f} min_us={later[0] / 1e3:9.1f}  {name[:110]}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summary(p)
