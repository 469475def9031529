"""Benchmarks of shuffled against the programs users would otherwise run (issue 5).

``python -m bench`` (or ``make bench``) runs every comparison, each side alternately,
prints a table of medians and ratios against the DESIGN.md section 8 targets, writes
``bench/results.json`` and refreshes the bench block of docs/benchmarks.md.
"""
