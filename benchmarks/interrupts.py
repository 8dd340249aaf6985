"""Ctrl-C at a random moment of a CBC or CP-SAT solve, many times: every exit clean?

    python benchmarks/interrupts.py [--trials 20] [--seed 0] [--out benchmarks/results/interrupts.md]

Each trial starts ``python -m amp_opt solve FILE --solver S --json`` with TMPDIR pointing
at a fresh folder, sends SIGINT (or SIGTERM for every fifth trial) after a random delay,
and checks: the exit code is 130 (143), stderr is one line, stdout is one JSON object
(the best plan so far, or the status), no process that was ever a child of the solve is
still alive, no process mentions the trial's folder, and no ``amp_opt_cbc_*`` folder is
left.  Half of the trials use ``instances/amp_het_cluster.json`` (programs run from
about 0.5 s; delays 0.2-1.0 s; a trial whose solve ends before the signal counts as clean when
it exits 0 with its complete result), half a generated 192-GPU instance (``generate --seed 7
--nodes 24 --devices-per-node 8 --device-types 4 --layers 96 --global-batch 512``;
delays 0.3-10 s: loading, the DP incumbents, the kind search or the programs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HET = ROOT / "instances" / "amp_het_cluster.json"


def children(pid: int) -> set[int]:
    try:
        return {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except (FileNotFoundError, ProcessLookupError):
        return set()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def trial(instance: Path, solver: str, delay: float, sig: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="amp_opt_trial_") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        proc = subprocess.Popen([sys.executable, "-m", "amp_opt", "solve", str(instance), "--solver", solver, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        seen: set[int] = set()
        start = time.perf_counter()
        while time.perf_counter() - start < delay and proc.poll() is None:
            seen |= children(proc.pid)
            time.sleep(0.005)
        running_child = bool(children(proc.pid))
        finished_first = proc.poll() is not None
        if not finished_first:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        after = time.perf_counter() - start - delay
        time.sleep(0.2)
        survivors = [pid for pid in seen if alive(pid)] + [pid for pid in mentioning(tmp) if pid != os.getpid()]
        leftovers = [p.name for p in Path(tmp).glob("amp_opt_cbc_*")]
    try:
        doc = json.loads(out)
        shown = "plan" if "plan" in doc else doc.get("status", "?")
    except json.JSONDecodeError:
        shown = "no JSON"
    lines = err.strip().splitlines()
    # A signal that lands while the finished process is already exiting leaves its complete
    # result and exit 0: that counts as "done before the signal", not as an interrupt.
    completed = proc.returncode == 0 and not lines and shown == "plan"
    finished_first = finished_first or completed
    expected = 0 if finished_first else 128 + sig
    clean = (proc.returncode == expected and len(lines) <= 1 and shown != "no JSON" and not survivors
             and not leftovers)
    return {"delay": delay, "signal": signal.Signals(sig).name, "rc": proc.returncode, "finished_first": finished_first,
            "cbc_running": running_child, "children_seen": len(seen), "exit_after": after, "stdout": shown,
            "stderr": lines[-1] if lines else "", "survivors": survivors, "leftovers": leftovers, "clean": clean}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per solver (default: 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random delays (default: 0)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "interrupts.md"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="amp_opt_bench_") as tmp:
        big = Path(tmp) / "g192.json"
        subprocess.run([sys.executable, "-m", "amp_opt", "generate", "--seed", "7", "--nodes", "24",
                        "--devices-per-node", "8", "--device-types", "4", "--layers", "96", "--global-batch", "512",
                        "-o", str(big)], check=True, cwd=ROOT)
        rows = []
        for solver in ("cbc", "cpsat"):
            for i in range(args.trials):
                instance, delay = (HET, rng.uniform(0.2, 1.0)) if i % 2 == 0 else (big, rng.uniform(0.3, 10.0))
                sig = signal.SIGTERM if i % 5 == 4 else signal.SIGINT
                r = trial(instance, solver, delay, sig)
                r.update(solver=solver, instance=instance.name)
                print(r, file=sys.stderr)
                rows.append(r)
    load = os.getloadavg()[0]
    lines = ["# Interrupts: a signal at a random moment of a solve", "",
             f"Command: `python benchmarks/interrupts.py --trials {args.trials} --seed {args.seed}`", "",
             f"Machine: cores {os.cpu_count()}, python {platform.python_version()}, {platform.platform()}, "
             f"load average at the end {load:.1f}, date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    for solver in ("cbc", "cpsat"):
        mine = [r for r in rows if r["solver"] == solver]
        interrupted = [r for r in mine if not r["finished_first"]]
        lines.append(f"- {solver}: {sum(r['clean'] for r in mine)} of {len(mine)} clean; {len(interrupted)} interrupted "
                     f"({sum(r['cbc_running'] for r in interrupted)} while a CBC child ran), "
                     f"{len(mine) - len(interrupted)} finished before the signal; leftover processes "
                     f"{sum(len(r['survivors']) for r in mine)}, leftover folders {sum(len(r['leftovers']) for r in mine)}; "
                     f"longest time from signal to exit {max([r['exit_after'] for r in interrupted], default=0):.2f} s")
    lines += ["", "| solver | instance | delay s | signal | exit | CBC child running | exit after s | stdout | stderr | clean |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['solver']} | {r['instance']} | {r['delay']:.2f} | {r['signal']} | {r['rc']} | "
                     f"{'yes' if r['cbc_running'] else 'no'} | {r['exit_after']:.2f} | {r['stdout']} | {r['stderr']} | "
                     f"{'yes' if r['clean'] else 'NO'} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
