"""Experiments shared by ``labs/`` (command-line runs) and the lesson notebooks (inline figures).

Each one takes the implementation to measure as a namespace (the reference module, or a notebook's
globals), so a notebook draws its figures from the student's own functions.
"""
