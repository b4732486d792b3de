"""Turns a bench/run.sh log into JSON, a Markdown table and a PNG plot of
dump and restore time against GPU memory size, gpucr beside the stock path.

    python3 report.py LOG BASE      -> BASE.json, BASE.md, BASE.png
"""
import json
import shlex
import sys


def parse(path):
    rows, steady, header = [], [], []
    for line in open(path):
        if line.startswith("#"):
            header.append(line[1:].strip())
            continue
        if not line.startswith("BENCH "):
            continue
        kv = dict(p.split("=", 1) for p in shlex.split(line[6:]))
        (steady if "steady" in kv else rows).append(kv)
    return header, rows, steady


def main():
    log, base = sys.argv[1], sys.argv[2]
    header, rows, steady = parse(log)
    json.dump({"header": header, "runs": rows, "steady": steady}, open(base + ".json", "w"), indent=1)
    by = {(r["system"], r["gib"]): r for r in rows}
    sizes = sorted({float(r["gib"]) for r in rows})
    md = ["# gpucr vs the stock CRIU cuda plugin", ""] + ["    " + h for h in header] + [""]
    md += ["| GiB | system | dump (s) | restore (s) | first step after restore (s) | image (MiB) | results |",
           "|---|---|---|---|---|---|---|"]
    for g in sizes:
        for sys_ in ("stock", "gpucr", "gpucr-bg", "gpucr-image"):
            r = by.get((sys_, "%g" % g)) or by.get((sys_, str(g))) or by.get((sys_, str(int(g))))
            if not r:
                continue
            if r.get("ok") != "1":
                md.append("| %g | %s | failed: %s | | | | |" % (g, sys_, r.get("reason", "")))
                continue
            md.append("| %g | %s | %.2f | %.2f | %.2f | %d | identical |" % (
                g, sys_, float(r["dump_s"]), float(r["restore_s"]), float(r["first_step_s"]),
                int(r["image_bytes"]) // 1048576))
        s, c = by.get(("stock", "%g" % g)), by.get(("gpucr", "%g" % g))
        if s and c and s.get("ok") == "1" and c.get("ok") == "1":
            md.append("| %g | ratio stock/gpucr | %.1fx | %.1fx | %.1fx | | |" % (
                g, float(s["dump_s"]) / max(float(c["dump_s"]), 1e-9),
                float(s["restore_s"]) / max(float(c["restore_s"]), 1e-9),
                float(s["first_step_s"]) / max(float(c["first_step_s"]), 1e-9)))
    if steady:
        md += ["", "| steady state (mean of runs in the order without, with, with, without) | without gpucr (s) | with gpucr's shim (s) | overhead |", "|---|---|---|---|"]
        for name in sorted({s["steady"] for s in steady}):
            a = [float(s["seconds"]) for s in steady if s["steady"] == name and s["shim"] == "0"]
            b = [float(s["seconds"]) for s in steady if s["steady"] == name and s["shim"] == "1"]
            if a and b:
                ma, mb = sum(a) / len(a), sum(b) / len(b)
                md.append("| %s | %.2f | %.2f | %+.1f%% |" % (name, ma, mb, (mb / ma - 1) * 100))
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
