#!/usr/bin/env bash
# Session 15, calls 2-13: the big wheel set stashed on one warm machine, one part a call (adapters/COMPETITORS.md:
# .devpkgs repacked in parts of <= 35 MB, since the working tree is ~29 MB and a call carries 64 MiB in all).
# Each call carried one part (`carry: [".devpkgs/part-NN"]`) and ran:
bash reports/evidence/run_h200.sh stash 2>&1 | grep -E "stashed|skipped"
# in the order part-02 .. part-09, part-11, part-12, part-13, part-15 (part-16 travels with call 14).
# stash.log here: each call's "stashed: N of 13 pieces" line, as it came back.
