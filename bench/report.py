"""Turns a bench/run.sh log into JSON, a Markdown table and a PNG plot of
dump and restore time against GPU memory size, gpucr beside the stock path.

    python3 report.py LOG BASE      -> BASE.json, BASE.md, BASE.png
"""
import json
import re
import shlex
import statistics
import sys


def parse(path):
    rows, steady, header, images, workloads, ckpts = [], [], [], [], [], []
    dd = []  # dd's own "N bytes ... copied, S s, ..." lines, write then read
    for line in open(path):
        if line.startswith("#"):
            header.append(line[1:].strip())
            continue
        m = re.match(r"(\d+) bytes .* copied, ([0-9.]+) s,", line)
        if m:
            dd.append(int(m.group(1)) / float(m.group(2)) / 1e9)
            continue
        if not line.startswith("BENCH "):
            continue
        kv = dict(p.split("=", 1) for p in shlex.split(line[6:]))
        if kv.get("image") == "disk" and len(dd) >= 2:
            # From dd's own figures (bench/run.sh before 2026-11-30 run 3
            # divided by dd's rate instead of its seconds in the BENCH line).
            kv["dd_write_gbs"], kv["dd_read_gbs"] = "%.2f" % dd[-2], "%.2f" % dd[-1]
            dd = []
        (steady if "steady" in kv else images if "image" in kv else ckpts if "ckpt" in kv else
         workloads if "workload" in kv else rows).append(kv)
    return header, rows, steady, images, workloads, ckpts


def main():
    log, base = sys.argv[1], sys.argv[2]
    header, rows, steady, images, workloads, ckpts = parse(log)
    json.dump({"header": header, "runs": rows, "workloads": workloads, "steady": steady,
               "image_engine": images, "checkpoints_while_running": ckpts}, open(base + ".json", "w"), indent=1)
    by = {(r["system"], r["gib"]): r for r in rows}
    sizes = sorted({float(r["gib"]) for r in rows})
    md = ["# gpucr vs the stock CRIU cuda plugin", ""] + ["    " + h for h in header] + [""]
    md += ["| GiB | system | dump (s) | restore (s) | first step after restore (s) | image (MiB) | results |",
           "|---|---|---|---|---|---|---|"]
    for g in sizes:
        for sys_ in dict.fromkeys(r["system"] for r in rows):  # in the run's order
            r = by.get((sys_, "%g" % g)) or by.get((sys_, str(g))) or by.get((sys_, str(int(g))))
            if not r:
                continue
            if r.get("ok") != "1":
                md.append("| %g | %s | failed: %s | | | | |" % (g, sys_, r.get("reason", "")))
                continue
            md.append("| %g | %s | %.2f | %.2f | %.2f | %d | identical |" % (
                g, sys_, float(r["dump_s"]), float(r["restore_s"]), float(r["first_step_s"]),
                int(r["image_bytes"]) // 1048576))
        for other in ("gpucr", "gpucr-bg"):
            s, c = by.get(("stock", "%g" % g)), by.get((other, "%g" % g))
            if s and c and s.get("ok") == "1" and c.get("ok") == "1":
                md.append("| %g | ratio stock/%s | %.1fx | %.1fx | %.1fx | | |" % (
                    g, other, float(s["dump_s"]) / max(float(c["dump_s"]), 1e-9),
                    float(s["restore_s"]) / max(float(c["restore_s"]), 1e-9),
                    float(s["first_step_s"]) / max(float(c["first_step_s"]), 1e-9)))
    if steady:
        md += ["", "| steady state (runs alternate without and with the shim) | median step without gpucr (ms) | with gpucr's shim (ms) | overhead | each run's median step without / with (ms) | whole run without / with (s) |",
               "|---|---|---|---|---|---|"]
        for name in sorted({s["steady"] for s in steady}):
            def vals(key, shim):
                return [float(s[key]) for s in steady if s["steady"] == name and s["shim"] == shim and key in s
                        and s[key] != "nan"]

            def median(v):
                return statistics.median(v) if v else None

            def each(v):
                return ", ".join("%.2f" % x for x in v)
            st = {shim: vals("step_ms", shim) for shim in ("0", "1", "2")}
            ra, rb = median(vals("seconds", "0")), median(vals("seconds", "1"))
            sa, sb, sv = median(st["0"]), median(st["1"]), median(st["2"])
            if ra is None or rb is None:
                continue
            if sa is not None and sb is not None:
                md.append("| %s | %.2f | %.2f | %+.1f%% | %s / %s | %.2f / %.2f |" % (
                    name, sa, sb, (sb / sa - 1) * 100, each(st["0"]), each(st["1"]), ra, rb))
            else:
                md.append("| %s | | | %+.1f%% (whole run) | | %.2f / %.2f |" % (name, (rb / ra - 1) * 100, ra, rb))
            if sv is not None and sa is not None:
                md.append("| %s, shim with GPUCR_VMM=0 (device memory left to the driver) | %.2f | %.2f | %+.1f%% | %s | %.2f / %.2f |" % (
                    name, sa, sv, (sv / sa - 1) * 100, each(st["2"]), ra, median(vals("seconds", "2"))))
    if workloads:
        md += ["", "| workload | system | dump (s) | restore (s) | first step after restore (s) | image (MiB) | results |",
               "|---|---|---|---|---|---|---|"]
        wby = {(w["workload"], w["system"]): w for w in workloads}
        for name in dict.fromkeys(w["workload"] for w in workloads):
            for sys_ in ("reference", "stock", "gpucr", "gpucr-bg", "gpucr-image"):
                w = wby.get((name, sys_))
                if not w:
                    continue
                if w.get("ok") != "1":
                    md.append("| %s | %s | failed: %s | | | | |" % (name, sys_, w.get("reason", "")))
                    continue
                md.append("| %s | %s | %.2f | %.2f | %.2f | %d | every step identical |" % (
                    name, sys_, float(w["dump_s"]), float(w["restore_s"]), float(w["first_step_s"]),
                    int(w["image_bytes"]) // 1048576))
            s_, c = wby.get((name, "stock")), wby.get((name, "gpucr-bg")) or wby.get((name, "gpucr"))
            if s_ and c and s_.get("ok") == "1" and c.get("ok") == "1":
                md.append("| %s | ratio stock/%s | %.1fx | %.1fx | %.1fx | | |" % (
                    name, c["system"], float(s_["dump_s"]) / max(float(c["dump_s"]), 1e-9),
                    float(s_["restore_s"]) / max(float(c["restore_s"]), 1e-9),
                    float(s_["first_step_s"]) / max(float(c["first_step_s"]), 1e-9)))
    if ckpts:
        md += ["", "| checkpoint of a running program | system | time lost by its loop (ms) | checkpoint command (s) | restore of it (s) | restored run |",
               "|---|---|---|---|---|---|"]
        for c in ckpts:
            if c.get("ok") != "1":
                md.append("| %s | %s | failed: %s | | | |" % (c["ckpt"], c["system"], c.get("reason", "")))
            else:
                md.append("| %s | %s | %s | %s | %s | every step identical |" % (
                    c["ckpt"], c["system"], c["lost_ms"], c["checkpoint_s"], c["restore_s"]))
    if images:
        md += ["", "| image engine (bin/imgbench) | GiB | GPU -> image (GB/s) | image -> GPU, fingerprints checked (GB/s) | dd O_DIRECT write / read on the same disk (GB/s) | image engine / dd | host ceilings: GPU -> pinned memory, memory -> files (GB/s) |",
               "|---|---|---|---|---|---|---|"]
        for im in images:
            if im.get("ok") == "0":
                md.append("| %s | %s | failed: %s | | | | |" % (im["image"], im["gib"], im.get("reason", "")))
                continue
            dd, ratio = "", ""
            if "dd_write_gbs" in im:
                dd = "%s / %s" % (im["dd_write_gbs"], im["dd_read_gbs"])
                ratio = "%.0f%% / %.0f%%" % (100 * float(im["write_gbs"]) / max(float(im["dd_write_gbs"]), 1e-9),
                                            100 * float(im["read_gbs"]) / max(float(im["dd_read_gbs"]), 1e-9))
            ceil = ("%s, %s" % (im["ceil_d2h_gbs"], im["ceil_files_gbs"])) if "ceil_d2h_gbs" in im else ""
            md.append("| %s | %s | %s | %s | %s | %s | %s |" % (im["image"] + (" " + im["dir"] if "dir" in im else ""),
                                                              im["gib"], im["write_gbs"], im["read_gbs"], dd, ratio, ceil))
    open(base + ".md", "w").write("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "dump_s", "dump (process frozen), s"),
                           (axes[1], "restore_s", "restore, s")):
        for sys_, style in (("stock", "o-"), ("gpucr", "s-"), ("gpucr-bg", "d-"), ("gpucr-image", "^--")):
            pts = [(float(r["gib"]), float(r[key])) for r in rows if r["system"] == sys_ and r.get("ok") == "1"]
            if pts:
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=sys_)
        ax.set_xlabel("GPU memory of the process (GiB)")
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=100)


if __name__ == "__main__":
    main()
