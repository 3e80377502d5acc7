#!/usr/bin/env python3
"""Mutation testing of the example C plugin against the conformance suite.

Makes single-point mutants of backends/plugin/examples/c-minimal/minimal.c — a
relational, logical or arithmetic operator swapped, an integer constant changed, an
argument check removed, an error return replaced by success, a statement deleted —
builds each as a plugin, and runs the conformance suite on the plugin's devices alone
(no other backend), the way a vendor qualifies a device: the abi, core and training
profiles. A mutant is killed when a run fails (a failed case, a crash, a hang past the
deadline); it survives when every run passes. Mutants that do not compile are left
out.

Usage:
  scripts/mutate-plugin.py [--xpu target/release/xpu] [--jobs 2] [--limit N]
                           [--seed S] [--only LINE[,LINE…]] [--out DIR]

Prints the share of mutants killed and writes DIR/survivors.txt (each survivor's line,
operator and diff) and DIR/results.json. Build the release binary first
(`cargo build --release`).
"""

import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "backends/plugin/examples/c-minimal/minimal.c")
INCLUDE = os.path.join(ROOT, "backends/plugin/include")

# Operator swaps: (name, pattern, replacement). Patterns avoid `<<`, `>>`, `->`, `<=`
# inside `<<=` and the like.
SWAPS = [
    ("ROR <= to <", r"(?<![<>=!])<=(?!=)", "<"),
    ("ROR < to <=", r"(?<![<-])<(?![<=])", "<="),
    ("ROR >= to >", r"(?<![<>=!])>=(?!=)", ">"),
    ("ROR > to >=", r"(?<![>-])>(?![>=])", ">="),
    ("ROR == to !=", r"==", "!="),
    ("ROR != to ==", r"!=", "=="),
    ("LCR && to ||", r"&&", "||"),
    ("LCR || to &&", r"\|\|", "&&"),
    ("AOR + to -", r"(?<=\w|\)) \+ (?=\w|\()", " - "),
    ("AOR - to +", r"(?<=\w|\)) - (?=\w|\()", " + "),
    ("AOR * to /", r"(?<=\w|\)) \* (?=\w|\()", " / "),
]

STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def code_spans(line):
    """The parts of a line outside string and character literals and comments, as
    (start, end) pairs."""
    out, pos = [], 0
    comment = line.find("//")
    for m in STRING.finditer(line):
        if comment != -1 and m.start() > comment:
            break
        out.append((pos, m.start()))
        pos = m.end()
    end = len(line)
    c = line.find("//", pos)
    if c != -1:
        end = c
    c = line.find("/*", pos)
    if c != -1:
        end = min(end, c)
    out.append((pos, end))
    return out


def mutable_lines(lines):
    """Indexes of lines inside function bodies: not comments, not preprocessor lines,
    not the function table at the end."""
    result = []
    depth, in_comment, in_function = 0, False, False
    for i, line in enumerate(lines):
        s = line.strip()
        if in_comment:
            if "*/" in s:
                in_comment = False
            continue
        if s.startswith("/*") and "*/" not in s:
            in_comment = True
            continue
        if s.startswith("#") or s.startswith("*") or s.startswith("//"):
            continue
        if depth == 0:
            in_function = bool(re.match(r"^(static |XPU_PLUGIN_EXPORT )", line)) and "(" in line and "=" not in line.split("(")[0]
        if depth > 0 and in_function:
            result.append(i)
        depth += line.count("{") - line.count("}")
        if depth < 0:
            depth = 0
    return result


def mutants(text):
    lines = text.split("\n")
    out = []
    for i in mutable_lines(lines):
        line = lines[i]
        spans = code_spans(line)
        for name, pattern, repl in SWAPS:
            for a, b in spans:
                for m in re.finditer(pattern, line[a:b]):
                    s, e = a + m.start(), a + m.end()
                    out.append((i, name, line[:s] + repl + line[e:]))
        for a, b in spans:
            for m in re.finditer(r"(?<![\w.])(\d+)(u|ull|ULL|U)?(?![\w.])", line[a:b]):
                n = int(m.group(1))
                new = "1" if n == 0 else ("0" if n == 1 else str(n + 1))
                s, e = a + m.start(1), a + m.end(1)
                out.append((i, f"CR {n} to {new}", line[:s] + new + line[e:]))
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if "REQUIRE(" in line and not stripped.startswith("#"):
            out.append((i, "check removed", line.replace("REQUIRE(", "REQUIRE(1 || ", 1)))
        if stripped.startswith("return error_new(") and stripped.endswith(";"):
            out.append((i, "error return to success", indent + "return NULL;"))
        elif (
            stripped.endswith(";")
            and not stripped.startswith(("return", "break", "continue", "case", "default", "goto", "}", "else"))
            and re.match(r"^[a-z_][\w\->\[\].*]*\s*(\(|=|\+=|-=|\|=|&=|\+\+|--)", stripped)
            and not re.match(r"^(const |static |unsigned |struct |enum |[a-z_0-9]+_t |int |char |float |double |size_t |void )", stripped)
        ):
            out.append((i, "statement deleted", indent + ";"))
    return lines, out


def suite(args, lib, profile, env):
    """Runs one profile on the mutant; None when it passes, else why it failed. Stops
    at the first failed case: one is enough to kill the mutant."""
    cmd = ["timeout", "-k", "5", str(args.deadline), args.xpu, "conformance", "--plugin", lib,
           "--devices", "plugin.minimal:*", "--profile", profile, "--case-timeout", "10"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, errors="replace", start_new_session=True)
    last = ""
    for line in proc.stdout:
        if line.startswith("FAIL"):
            # The whole group: `timeout` and the suite under it.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"{profile}: {line.strip()}"
        if line.strip():
            last = line.strip()
    code = proc.wait()
    if code != 0:
        return f"{profile}: exit {code}: {last}"
    return None


def run_one(args, lines, index, mutant):
    i, name, new_line = mutant
    mutated = lines[:]
    mutated[i] = new_line
    with tempfile.TemporaryDirectory(prefix="xpu-mutant-") as d:
        src = os.path.join(d, "minimal.c")
        lib = os.path.join(d, "libxpu_minimal.so")
        with open(src, "w") as f:
            f.write("\n".join(mutated))
        cc = subprocess.run(
            ["cc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
             "-w", "-I", INCLUDE, src, "-o", lib, "-lm"],
            capture_output=True, text=True)
        if cc.returncode != 0:
            return index, "stillborn", ""
        env = {k: v for k, v in os.environ.items() if not k.startswith("XPU_")}
        for profile in ("abi", "core", "training"):
            verdict = suite(args, lib, profile, env)
            if verdict is not None:
                return index, "killed", verdict
        return index, "survived", ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xpu", default=os.path.join(ROOT, "target/release/xpu"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--limit", type=int, default=0, help="run a random sample of this many")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default="", help="only mutants of these 1-based lines")
    p.add_argument("--deadline", type=int, default=300, help="seconds per suite run")
    p.add_argument("--out", default=os.path.join(ROOT, "target/mutants-plugin"))
    args = p.parse_args()
    if not os.access(args.xpu, os.X_OK):
        sys.exit(f"{args.xpu} is not built; run `cargo build --release` first")
    with open(SOURCE) as f:
        lines, all_mutants = mutants(f.read())
    chosen = list(enumerate(all_mutants))
    if args.only:
        wanted = {int(x) - 1 for x in args.only.split(",")}
        chosen = [c for c in chosen if c[1][0] in wanted]
    if args.limit and len(chosen) > args.limit:
        chosen = random.Random(args.seed).sample(chosen, args.limit)
        chosen.sort()
    print(f"{len(all_mutants)} mutants of {os.path.relpath(SOURCE, ROOT)}; running {len(chosen)} with {args.jobs} jobs", flush=True)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, args, lines, idx, m) for idx, m in chosen]
        for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            idx, status, detail = fut.result()
            results[idx] = (status, detail)
            if n % 25 == 0:
                print(f"  {n}/{len(chosen)}", flush=True)
    counts = {}
    for status, _ in results.values():
        counts[status] = counts.get(status, 0) + 1
    viable = counts.get("killed", 0) + counts.get("survived", 0)
    killed = counts.get("killed", 0)
    with open(os.path.join(args.out, "survivors.txt"), "w") as f:
        for idx, (status, _) in sorted(results.items()):
            if status != "survived":
                continue
            i, name, new_line = all_mutants[idx]
            f.write(f"minimal.c:{i + 1}: {name}\n  - {lines[i].strip()}\n  + {new_line.strip()}\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump([
            {"line": all_mutants[idx][0] + 1, "operator": all_mutants[idx][1],
             "mutant": all_mutants[idx][2].strip(), "status": s, "detail": d}
            for idx, (s, d) in sorted(results.items())], f, indent=1)
    print(f"killed {killed} of {viable} viable mutants ({100.0 * killed / max(viable, 1):.1f}%); "
          f"{counts.get('stillborn', 0)} did not compile; survivors in {os.path.join(args.out, 'survivors.txt')}")


if __name__ == "__main__":
    main()
